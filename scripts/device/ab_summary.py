"""ab_summary.py — the summary table of scripts/device/ab.sh's paired rounds.

Reads the rows ab.sh writes (tab-separated: round, part, setting, level, tok/s; setting
"(default)" is the part's baseline) and prints, per part and setting, for every level: the mean
over the rounds, and for a setting other than the baseline the mean of its per-round ratios to
the baseline of the same round (as a change in %) and in how many rounds it was ahead. Rounds
run the settings one after another, so a drift of the machine within the call moves all of
them alike; single runs of these benchmarks spread 3-5 % (bench/NOTES.md, tenth session).

    python3 scripts/device/ab_summary.py ab.tsv
"""
import collections
import sys

BASE = "(default)"


def load(path):
    """{(part, setting): {level: {round: value}}}, with parts and settings in first-seen order."""
    rows = collections.OrderedDict()
    levels = collections.OrderedDict()
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            fields = line.split("\t")
            if len(fields) != 5:
                raise SystemExit(f"ab_summary: bad row (want 5 tab-separated fields): {line!r}")
            rnd, part, setting, level, value = fields
            rows.setdefault((part, setting), collections.OrderedDict()).setdefault(level, {})[
                int(rnd)] = float(value)
            levels.setdefault(part, collections.OrderedDict())[level] = None
    return rows, levels


def summarize(rows, levels):
    """Lines of the table (see the module comment)."""
    out = []
    rounds = sorted({r for per in rows.values() for lv in per.values() for r in lv})
    out.append(f"summary over {len(rounds)} round(s): mean tok/s per level; other settings also "
               "their mean change against the baseline of the same round and the rounds they were ahead")
    for (part, setting), per in rows.items():
        base = rows.get((part, BASE))
        cells = []
        for level in levels[part]:
            vals = per.get(level, {})
            if not vals:
                cells.append(f"{level}: -")
                continue
            mean = sum(vals.values()) / len(vals)
            cell = f"{level}: {mean:.1f}"
            if setting == BASE:
                if len(vals) > 1:
                    cell += f" [{min(vals.values()):.1f}-{max(vals.values()):.1f}]"
            elif base and base.get(level):
                paired = [(v, base[level][r]) for r, v in vals.items()
                          if r in base[level] and base[level][r] > 0]
                if paired:
                    ratio = sum(v / b for v, b in paired) / len(paired)
                    ahead = sum(1 for v, b in paired if v > b)
                    cell += f" {100 * (ratio - 1):+.1f} % {ahead}/{len(paired)}"
            cells.append(cell)
        out.append(f"{part:<8} {setting:<28} " + "  ".join(cells))
    return out


def main(argv):
    if len(argv) != 2:
        raise SystemExit("usage: ab_summary.py ROWS.tsv")
    rows, levels = load(argv[1])
    print("\n".join(summarize(rows, levels)))


if __name__ == "__main__":
    main(sys.argv)
