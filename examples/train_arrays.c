/* Training on your own data from C: samples and labels in arrays (here
 * made up: 8 features, 3 classes given by which of three fixed directions
 * a point lies closest to, plus noise), handed to loom as a data set with
 * loom_dataset_from_arrays, then the same loader, model and optimizer as
 * for Fashion-MNIST (examples/train_api.c). Prints the test accuracy and
 * exits 1 below 90%.
 *
 *   train_arrays [STEPS]      (default 300)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "loom/loom.h"

#define D 8 /* features */
#define K 3 /* classes */
#define NTRAIN 3000
#define NTEST 1000

#define CHECK(expr)                                                            \
  do {                                                                         \
    loom_status s_ = (expr);                                                   \
    if (s_ != LOOM_OK) {                                                       \
      fprintf(stderr, "train_arrays: %s: %s\n", #expr, loom_last_error());     \
      status = 1;                                                              \
      goto done;                                                               \
    }                                                                          \
  } while (0)

/* A small deterministic generator (the data need not be loom's RNG). */
static double uniform(uint64_t *s) {
  *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
  return (double)(*s >> 11) / 9007199254740992.0;
}

/* n points: x (n, D) in [-1, 1] plus noise, y the closest direction. */
static void make(float *x, int32_t *y, int n, uint64_t *s) {
  static const float dir[K][D] = {{1, 1, 0, 0, 0, 0, -1, 0},
                                  {0, -1, 1, 1, 0, 0, 0, 0},
                                  {-1, 0, 0, -1, 1, 1, 0, 0}};
  for (int i = 0; i < n; i++) {
    float best = -INFINITY;
    for (int j = 0; j < D; j++)
      x[i * D + j] = (float)(2 * uniform(s) - 1);
    for (int k = 0; k < K; k++) {
      float dot = 0;
      for (int j = 0; j < D; j++)
        dot += dir[k][j] * x[i * D + j];
      if (dot > best) {
        best = dot;
        y[i] = k;
      }
    }
    for (int j = 0; j < D; j++) /* noise after the label */
      x[i * D + j] += (float)(0.1 * (2 * uniform(s) - 1));
  }
}

int main(int argc, char **argv) {
  int64_t steps = argc > 1 ? atoll(argv[1]) : 300;
  int status = 0;
  static float xtr[NTRAIN * D], xte[NTEST * D];
  static int32_t ytr[NTRAIN], yte[NTEST];
  uint64_t seed = 7;
  make(xtr, ytr, NTRAIN, &seed);
  make(xte, yte, NTEST, &seed);
  loom_dataset *train = NULL, *test = NULL;
  loom_model *model = NULL;
  loom_xent *xent = NULL;
  loom_loader *loader = NULL, *tl = NULL;
  loom_optim *optim = NULL;

  /* The arrays as data sets: (N, 1, 1, D) samples, labels in [0, K). */
  loom_array_opts ao = loom_array_opts_default();
  ao.classes = K;
  ao.name = "train arrays";
  CHECK(loom_dataset_from_arrays(&train, xtr, ytr, NTRAIN, 1, 1, D, &ao));
  ao.name = "test arrays";
  CHECK(loom_dataset_from_arrays(&test, xte, yte, NTEST, 1, 1, D, &ao));

  /* An MLP D -> 64 -> 64 -> K. */
  loom_fashion_mlp_opts mo = loom_fashion_mlp_opts_default();
  mo.in = D;
  mo.hidden = 64;
  mo.classes = K;
  loom_model_opts init = loom_model_opts_default();
  init.seed = 1;
  CHECK(loom_fashion_mlp_new(&model, &mo, &init));
  CHECK(loom_xent_new(&xent));

  loom_loader_opts lo = loom_loader_opts_default();
  lo.sampler.seed = 1;
  lo.sampler.batch = 64;
  CHECK(loom_loader_new(&loader, train, &lo));
  loom_optim_opts oo = loom_optim_opts_default();
  oo.kind = LOOM_OPTIM_ADAMW;
  CHECK(loom_optim_new(&optim, &oo, loom_model_view(model, 0),
                       loom_model_num_views(model),
                       loom_model_num_params(model)));
  for (int64_t step = 0; step < steps; step++) {
    const loom_batch *b;
    loom_tensor logits, dlogits;
    loom_xent_stats st;
    CHECK(loom_loader_next(loader, &b));
    loom_model_zero_grad(model);
    CHECK(loom_model_forward(model, &b->x, &logits));
    CHECK(loom_xent_forward(xent, &logits, (const int32_t *)b->y.data, &st));
    CHECK(loom_model_output_grad(model, &dlogits));
    CHECK(loom_xent_backward(xent, &dlogits, 1.0f));
    CHECK(loom_model_backward(model, NULL, NULL));
    CHECK(loom_optim_step(optim, loom_model_params(model),
                          loom_model_grads(model), 3e-3f));
    if ((step + 1) % 100 == 0 || step + 1 == steps)
      printf("step %lld/%lld loss %.4f\n", (long long)(step + 1),
             (long long)steps, st.loss);
  }

  /* The test arrays in one pass, in order. */
  loom_loader_opts to = loom_loader_opts_default();
  to.sampler.shuffle = false;
  to.sampler.tail = LOOM_TAIL_PARTIAL;
  to.sampler.batch = 250;
  to.prefetch = 0;
  CHECK(loom_loader_new(&tl, test, &to));
  loom_model_set_training(model, false);
  int64_t correct = 0, count = 0;
  for (int64_t i = 0; i < loom_loader_batches_per_epoch(tl); i++) {
    const loom_batch *b;
    loom_tensor logits;
    loom_xent_stats st;
    CHECK(loom_loader_next(tl, &b));
    CHECK(loom_model_forward(model, &b->x, &logits));
    CHECK(loom_xent_forward(xent, &logits, (const int32_t *)b->y.data, &st));
    correct += st.correct;
    count += st.count;
  }
  double acc = count ? (double)correct / (double)count : 0;
  printf("test accuracy %.2f%% (%lld of %lld)\n", 100 * acc, (long long)correct,
         (long long)count);
  if (acc < 0.9)
    status = 1;

done:
  loom_optim_free(optim);
  loom_loader_free(tl);
  loom_loader_free(loader);
  loom_xent_free(xent);
  loom_model_free(model);
  loom_dataset_free(test);
  loom_dataset_free(train);
  return status;
}
