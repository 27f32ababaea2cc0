/* test_kv_fp8_restore — the prefix cache over FP8 K/V pages (--kv-cache-dtype fp8, docs/fp8.md):
 * the restore-parity cases of tests/restore_cases.h on the CPU backend with FP8 pages. A
 * restored request continues from pages that the cache copied (copy-on-write of a partial last
 * page), kept, or moved through the host tier and back, each a page's e4m3 bytes and scales
 * together; it must match its cold run (cache off, the same split points) bit for bit, as it
 * does on fp32 pages (test_prefix_engine). */
#include "engine/engine.h"

#include <stdatomic.h>
#include <unistd.h>

#include "backend/cpu/backend_cpu.h"
#include "base/log.h"
#include "model/weights.h"
#include "test.h"

#define MODEL_DIR "tests/fixtures/models/dense_bf16"
#define MAXTOK 6
#define MAXP 400

#include "engine_rig.h"

static int restore_same(const char *name, const req *a, const req *b) {
  (void)name;
  return a->finish == b->finish && a->n_tok == b->n_tok && a->n_lg == b->n_lg &&
         memcmp(a->tok, b->tok, (size_t)a->n_tok * sizeof(int32_t)) == 0 &&
         memcmp(a->lg, b->lg, (size_t)(a->n_lg < MAXTOK ? a->n_lg : MAXTOK) * V * sizeof(float)) ==
             0;
}
#include "restore_cases.h"

TEST(fp8_pages) {
  EXPECT_EQ_INT(BE->kind_size(BE, BACKEND_KIND_KV), 1);
  EXPECT_EQ_INT(backend_kv_page_bytes(BE, C.n_kv_heads, C.head_dim),
                16 * C.n_kv_heads * (C.head_dim + 4));
}
TEST(parity_cut_on_page_boundary) { restore_case_shared_head("page_boundary", 80); }
TEST(parity_cut_mid_page) { restore_case_shared_head("partial_final_page", 90); }
TEST(parity_cut_mid_message) { restore_case_mid_message("mid_message"); }
TEST(parity_fresh_pages_while_decoding) {
  restore_case_fresh_pages("fresh_pages", "fresh_pages_other");
}
TEST(parity_restore_from_host_tier) { restore_case_host_tier("host_tier"); }
TEST(parity_next_turn_hits_end_of_generation) { restore_case_next_turn("next_turn"); }

int main(void) {
  char err[256];
  log_set_level(LOG_LEVEL_WARN);
  if (model_load(MODEL_DIR, &C, &W, err, sizeof err) != 0) {
    printf("FAIL load: %s\n", err);
    return 1;
  }
  backend_options o = {.n_threads = 2, .kv_dtype = BACKEND_KV_FP8_E4M3};
  BE = backend_cpu_create_opt(&o);
  if (!BE) {
    printf("FAIL backend\n");
    return 1;
  }
  V = (size_t)C.vocab_size;
  RUN(fp8_pages);
  RUN(parity_cut_on_page_boundary);
  RUN(parity_cut_mid_page);
  RUN(parity_cut_mid_message);
  RUN(parity_fresh_pages_while_decoding);
  RUN(parity_restore_from_host_tier);
  RUN(parity_next_turn_hits_end_of_generation);
  BE->destroy(BE);
  weights_free(&W);
  TEST_MAIN_END();
}
