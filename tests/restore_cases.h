/* restore_cases.h — the restore-parity scenarios, shared by tests/test_prefix_engine.c (the
 * CPU backend on the tiny fixture, bit for bit) and tests/cuda/test_cuda_restore.c (real shapes
 * on the GPU, scripts/device/check_real.sh): a request restored from a prefix-cache checkpoint
 * against the same request computed "cold" (cache off, the same prefill split points;
 * test_prefix_engine.c explains how each case's split points follow).
 *
 * The includer defines MAXTOK and MAXP, includes engine_rig.h, and defines
 *     static int restore_same(const char *name, const req *restored, const req *cold);
 * which returns 1 when the two agree to its standard (and may print what differs).
 *
 * Cases: a cut on a page boundary and one with a partial final page (copy-on-write of the last
 * page), a forced cut in the middle of a chat message (an END checkpoint at 99), a restore into
 * fresh pages while another request holds the pages the source had (the page table is not the
 * source's; that other request is compared with its own cold run too), a restore from the host
 * tier (a device budget of 1.5 slabs and a 12-page KV pool push the checkpoint out to the
 * host), and the next chat turn hitting the end-of-generation checkpoint. */
#ifndef DS_TEST_RESTORE_CASES_H
#define DS_TEST_RESTORE_CASES_H

static req RC_A, RC_B, RC_F, RC_R1, RC_R2;
static int32_t RC_S[MAXP], RC_PA[MAXP], RC_PB[MAXP], RC_PF[MAXP], RC_PT[MAXP];

/* A = S + a, then B = S + b restored at |S| (a chat boundary): B equals cold B with the split
 * points {|S| (boundary), n_B - 1 (END)}; A split nowhere below |S| (its tree was empty). */
static void restore_case_shared_head(const char *name, int ns) {
  toks(RC_S, ns, 7);
  int na = ns + 30, nb = ns + 25;
  prompt_make(RC_PA, RC_S, ns, na, 11, 3);
  prompt_make(RC_PB, RC_S, ns, nb, 12, 4);
  int32_t bnd[2] = {0, ns};
  rig g;
  rig_opts ro = {.cache = 1};
  REQUIRE(rig_up(&g, &ro) == 0);
  req_set(&RC_A, RC_PA, na, bnd, 2, NULL, 0);
  req_run(&g, &RC_A);
  EXPECT_EQ_INT(RC_A.finish, FINISH_LENGTH);
  EXPECT_EQ_INT(RC_A.cached, 0);
  req_set(&RC_B, RC_PB, nb, bnd, 2, NULL, 0);
  req_run(&g, &RC_B);
  EXPECT_EQ_INT(RC_B.cached, ns);
  engine_stats s;
  engine_get_stats(g.e, &s);
  EXPECT_EQ_INT(s.prefix_hits, 1);
  EXPECT_EQ_INT(s.prefix_hit_tokens, ns);
  EXPECT_EQ_INT(s.prefilled_tokens_total, na + (nb - ns));
  /* every checkpoint copy was timed: one save per capture, one restore, and a copy-on-write
   * page copy exactly when the cut is inside a page */
  EXPECT_EQ_INT(s.ckpt_captures_timed, s.prefix_captures);
  EXPECT_EQ_INT(s.ckpt_restores_timed, 1);
  EXPECT_EQ_INT(s.ckpt_restore_page_copies, ns % BACKEND_PAGE_TOKENS ? 1 : 0);
  EXPECT(s.prefix_captures >= 1);
  EXPECT(s.ckpt_capture_ms_sum >= 0 && s.ckpt_capture_ms_max <= s.ckpt_capture_ms_sum);
  EXPECT(s.ckpt_restore_ms_sum >= s.ckpt_restore_ms_max && s.ckpt_restore_ms_max >= 0);
  EXPECT(rig_down(&g));
  int32_t sp[1] = {nb - 1};
  REQUIRE(cold(&RC_R1, &RC_B, sp, 1) == 0);
  EXPECT_MSG(restore_same(name, &RC_B, &RC_R1), "restored at %d differs from cold", ns);
}

/* A = X (100 tokens, one message); B = X + 30 more tokens of the same message restores A's
 * END checkpoint at 99 (mid-page, mid-message). B's split points: 99 (restored), 100
 * (DIVERGE: B leaves the tree where A's generated path went on), 129 (END). */
static void restore_case_mid_message(const char *name) {
  toks(RC_PA, 100, 21);
  int32_t bnd[1] = {0};
  rig g;
  rig_opts ro = {.cache = 1};
  REQUIRE(rig_up(&g, &ro) == 0);
  req_set(&RC_A, RC_PA, 100, bnd, 1, NULL, 0);
  req_run(&g, &RC_A);
  REQUIRE(RC_A.finish == FINISH_LENGTH);
  memcpy(RC_PB, RC_PA, 100 * sizeof *RC_PB);
  toks(RC_PB + 100, 30, 22);
  RC_PB[100] = (RC_A.tok[0] + 1) % 256; /* leaves A's generated path at once */
  req_set(&RC_B, RC_PB, 130, bnd, 1, NULL, 0);
  req_run(&g, &RC_B);
  EXPECT_EQ_INT(RC_B.cached, 99);
  EXPECT(rig_down(&g));
  int32_t sp[3] = {99, 100, 129};
  REQUIRE(cold(&RC_R1, &RC_B, sp, 3) == 0);
  EXPECT_MSG(restore_same(name, &RC_B, &RC_R1), "mid-message restore differs from cold");
}

/* B restores while F decodes and holds pages, so B's fresh pages (its copy-on-write page and
 * its suffix) are other ids than A's were: F takes the head of the free queue right after A
 * retired. F (first token unshared) splits at its END only. */
static void restore_case_fresh_pages(const char *name, const char *name_other) {
  int ns = 90;
  toks(RC_S, ns, 31);
  prompt_make(RC_PA, RC_S, ns, 120, 32, 5);
  prompt_make(RC_PB, RC_S, ns, 110, 33, 6);
  toks(RC_PF, 100, 34);
  RC_PF[0] = 255 - RC_S[0] % 200; /* shares no path */
  int32_t bnd[2] = {0, ns};
  rig g;
  rig_opts ro = {.cache = 1};
  REQUIRE(rig_up(&g, &ro) == 0);
  req_set(&RC_A, RC_PA, 120, bnd, 2, NULL, 0);
  req_run(&g, &RC_A);
  req_set(&RC_F, RC_PF, 100, NULL, 0, NULL, 0);
  RC_F.max_tokens = 40;
  req_submit(&g, &RC_F);
  REQUIRE(req_first(&RC_F));
  engine_stats s;
  engine_get_stats(g.e, &s);
  EXPECT_MSG(s.kv_pages_used >= 7, "F holds %d pages", s.kv_pages_used);
  req_set(&RC_B, RC_PB, 110, bnd, 2, NULL, 0);
  req_run(&g, &RC_B);
  EXPECT_EQ_INT(RC_B.cached, ns);
  req_wait(&RC_F);
  EXPECT_EQ_INT(RC_F.finish, FINISH_LENGTH);
  EXPECT(rig_down(&g));
  int32_t sp[1] = {109};
  REQUIRE(cold(&RC_R1, &RC_B, sp, 1) == 0);
  EXPECT_MSG(restore_same(name, &RC_B, &RC_R1), "B restored while F decodes differs from cold");
  int32_t spf[1] = {99};
  REQUIRE(cold(&RC_R2, &RC_F, spf, 1) == 0);
  EXPECT_MSG(restore_same(name_other, &RC_F, &RC_R2), "F differs from cold");
}

/* One device slab's worth of budget (1.5 slabs) and 12 KV pages: A's checkpoint at |S| leaves
 * the device for the host tier (its slab when A's next capture needs the slab, its pages when
 * F needs the pool); B restores it from the host into fresh pages and its slot. */
static void restore_case_host_tier(const char *name) {
  int ns = 80;
  toks(RC_S, ns, 41);
  prompt_make(RC_PA, RC_S, ns, 110, 42, 7);
  prompt_make(RC_PB, RC_S, ns, 105, 43, 8);
  toks(RC_PF, 150, 44);
  RC_PF[0] = 200;
  if (RC_S[0] == 200) RC_PF[0] = 201;
  int32_t bnd[2] = {0, ns};
  rig g;
  rig_opts ro = {.cache = 1, .kv_tokens = 16 * 12, .seqs = 2, .slabs = 4};
  { /* a device budget of 1.5 slabs; a host budget for a few slabs and their pages */
    rig t;
    rig_opts r0 = {0};
    REQUIRE(rig_up(&t, &r0) == 0);
    double gib = 1024.0 * 1024.0 * 1024.0;
    ro.dev_gib = 1.5 * (double)qwen35_slot_bytes(t.m) / gib;
    ro.host_gib =
        (4.0 * (double)qwen35_slot_bytes(t.m) + 64.0 * (double)qwen35_page_bytes(t.m)) / gib;
    rig_down(&t);
  }
  REQUIRE(rig_up(&g, &ro) == 0);
  req_set(&RC_A, RC_PA, 110, bnd, 2, NULL, 0);
  req_run(&g, &RC_A);
  req_set(&RC_F, RC_PF, 150, NULL, 0, NULL, 0);
  req_run(&g, &RC_F);
  EXPECT_EQ_INT(RC_F.finish, FINISH_LENGTH);
  engine_stats s;
  engine_get_stats(g.e, &s);
  EXPECT_EQ_INT(s.prefix_device_slabs_max, 1);
  EXPECT_MSG(s.prefix_demotions >= 2 && s.prefix_host_checkpoints >= 1,
             "demotions %lld, host checkpoints %d", s.prefix_demotions, s.prefix_host_checkpoints);
  req_set(&RC_B, RC_PB, 105, bnd, 2, NULL, 0);
  req_run(&g, &RC_B);
  EXPECT_EQ_INT(RC_B.cached, ns);
  engine_get_stats(g.e, &s);
  EXPECT_EQ_INT(s.prefix_restore_failures, 0);
  EXPECT(s.prefix_host_bytes > 0 && s.prefix_host_bytes <= s.prefix_host_budget_bytes);
  EXPECT(rig_down(&g));
  int32_t sp[1] = {104};
  REQUIRE(cold(&RC_R1, &RC_B, sp, 1) == 0);
  EXPECT_MSG(restore_same(name, &RC_B, &RC_R1), "restore from the host tier differs from cold");
}

/* Turn 1: X (60 tokens) generates MAXTOK tokens; its end-of-generation checkpoint sits at
 * depth 60 + MAXTOK - 1 (the last generated token was never fed). Turn 2 = X + those tokens +
 * a new message restores that depth. Cold turn 2 splits like turn 1 below it (END 59, then one
 * token per step), at the restored depth, at its boundary and its END. */
static void restore_case_next_turn(const char *name) {
  toks(RC_PA, 60, 51);
  int32_t b1[1] = {0};
  rig g;
  rig_opts ro = {.cache = 1};
  REQUIRE(rig_up(&g, &ro) == 0);
  req_set(&RC_A, RC_PA, 60, b1, 1, NULL, 0);
  req_run(&g, &RC_A);
  REQUIRE(RC_A.finish == FINISH_LENGTH && RC_A.n_tok == MAXTOK);
  memcpy(RC_PT, RC_PA, 60 * sizeof *RC_PT);
  memcpy(RC_PT + 60, RC_A.tok, MAXTOK * sizeof *RC_PT);
  int n2 = 60 + MAXTOK + 20;
  toks(RC_PT + 60 + MAXTOK, 20, 52);
  int32_t b2[2] = {0, 60 + MAXTOK};
  req_set(&RC_B, RC_PT, n2, b2, 2, NULL, 0);
  req_run(&g, &RC_B);
  EXPECT_EQ_INT(RC_B.cached, 60 + MAXTOK - 1);
  EXPECT(rig_down(&g));
  int32_t sp[MAXTOK + 2];
  int k = 0;
  sp[k++] = 59;
  for (int p = 60; p <= 60 + MAXTOK - 1; p++)
    sp[k++] = p; /* 1-token steps, then the restored depth */
  sp[k++] = n2 - 1;
  REQUIRE(cold(&RC_R1, &RC_B, sp, k) == 0);
  EXPECT_MSG(restore_same(name, &RC_B, &RC_R1), "turn 2 differs from cold");
}

#endif
