/* cli — the deltaserve subcommands. Each lives in src/cli/cmd_<name>.c, parses its own flags,
 * and returns the process exit status (0 ok, 1 error with one clear line on stderr,
 * 2 usage error). */
#ifndef DS_CLI_H
#define DS_CLI_H

int cmd_run(int argc, char **argv);        /* offline generation (greedy ids or a prompts file) */
int cmd_serve(int argc, char **argv);      /* the OpenAI-compatible HTTP server */
int cmd_tokenize(int argc, char **argv);   /* text on stdin -> ids */
int cmd_detokenize(int argc, char **argv); /* ids on stdin -> text */
int cmd_render(int argc, char **argv);     /* chat request JSON on stdin -> prompt text */
int cmd_gen_random(int argc, char **argv); /* random-weight model folder from a config */
int cmd_run_batch(int argc, char **argv);  /* run --prompts-file: the engine, offline */
int cmd_bench(int argc, char **argv);      /* benchmark harness -> JSON */

#endif
