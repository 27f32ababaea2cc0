/* test_cuda_ahead — steps ahead (engine_step.c engine_step_flight) on the GPU, where the step ahead
 * really overlaps the step before it (its embedding reads the ids of a step still running):
 * plain-greedy requests through the engine give the same tokens and finishes with steps
 * ahead on as off (engine_rig.h rig_ahead_case: sixteen requests of different
 * prompt lengths alone, all at once, and with a stop token that ends some of them mid-output),
 * with the prefix cache off and on; steps went ahead; every pool checks clean with nothing left
 * held. And sampled requests: the same tokens with the backend's sample op as with the host
 * sampler (rig_device_sample_case).
 *
 * Environment: DS_REAL_MODEL (default: the tiny fixture tests/fixtures/models/dense_bf16). */
#include "backend/backend_create.h"
#include "base/log.h"
#include "engine/engine.h"
#include "model/weights.h"
#include "test.h"

#define MAXTOK 24
#define NREQ 16

#include "engine_rig.h"

static int32_t P[NREQ][300];
static const int LEN[NREQ] = {1, 5, 63, 64, 65, 100, 130, 17, 200, 33, 7, 129, 90, 3, 150, 70};

static void ahead_case(int cache) {
  const int32_t *prompts[NREQ];
  for (int i = 0; i < NREQ; i++) prompts[i] = P[i];
  rig_opts ro = {0};
  ro.cache = cache;
  ro.seqs = NREQ;
  rig_ahead_case(&ro, prompts, LEN, NREQ, 4);
}

TEST(ahead_same_tokens) { ahead_case(0); }
TEST(ahead_same_tokens_cache) { ahead_case(1); }

/* sampled steps: the backend's sample op (cuda_sample.cu) inside the decode graphs gives the
 * host sampler's tokens. On a batch-invariant backend (DS_BATCH_INVARIANT=1): how the engine
 * happens to batch the sixteen requests (they arrive while it steps) must not change the
 * logits, or a sampled token may differ for that reason alone. */
TEST(device_sample_same_tokens) {
  const int32_t *prompts[NREQ];
  for (int i = 0; i < NREQ; i++) prompts[i] = P[i];
  char err[256];
  backend *inv =
      backend_create(&(backend_options){.device = "cuda", .batch_invariant = 1}, err, sizeof err);
  REQUIRE(inv != NULL);
  backend *keep = BE;
  BE = inv;
  rig_opts ro = {0};
  ro.seqs = NREQ;
  rig_device_sample_case(&ro, prompts, LEN, NREQ);
  BE = keep;
  inv->destroy(inv);
}

int main(void) {
  char err[256];
  log_set_level(LOG_LEVEL_WARN);
  uint32_t x = 12345;
  for (int i = 0; i < NREQ; i++)
    for (int j = 0; j < LEN[i]; j++) {
      x = x * 1103515245u + 12345u;
      P[i][j] = (int32_t)((x >> 8) % 256);
    }
  const char *dir = getenv("DS_REAL_MODEL");
  if (!dir || !*dir) dir = "tests/fixtures/models/dense_bf16";
  if (model_load(dir, &C, &W, err, sizeof err) != 0) {
    printf("FAIL load: %s\n", err);
    return 1;
  }
  BE = backend_create(&(backend_options){.device = "cuda"}, err, sizeof err);
  if (!BE) {
    printf("FAIL backend: %s\n", err);
    return 1;
  }
  V = (size_t)C.vocab_size;
  RUN(ahead_same_tokens);
  RUN(ahead_same_tokens_cache);
  RUN(device_sample_same_tokens);
  BE->destroy(BE);
  weights_free(&W);
  TEST_MAIN_END();
}
