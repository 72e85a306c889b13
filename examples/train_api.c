/* A complete training program written against loom's C API alone: the
 * equivalent of a PyTorch training-script template. It trains the
 * fashion-mlp reference model on Fashion-MNIST with SGD + momentum, evaluates
 * on the test set and saves a checkpoint.
 *
 *   train_api [STEPS] [CKPT_DIR]      (defaults: one epoch, no checkpoint)
 */
#include <stdio.h>
#include <stdlib.h>

#include "loom/loom.h"

#define CHECK(expr)                                                            \
  do {                                                                         \
    loom_status s_ = (expr);                                                   \
    if (s_ != LOOM_OK) {                                                       \
      fprintf(stderr, "train_api: %s: %s\n", #expr, loom_last_error());        \
      status = 1;                                                              \
      goto done;                                                               \
    }                                                                          \
  } while (0)

/* Mean loss and accuracy over the whole test set. */
static loom_status evaluate(loom_model *model, loom_xent *xent,
                            const loom_dataset *test, double *loss,
                            double *acc) {
  loom_loader_opts lo = loom_loader_opts_default();
  lo.sampler.shuffle = false;
  lo.sampler.tail = LOOM_TAIL_PARTIAL; /* keep the last, short batch */
  lo.sampler.batch = 1000;
  lo.prefetch = 0;
  loom_loader *ld;
  LOOM_TRY(loom_loader_new(&ld, test, &lo));
  loom_model_set_training(model, false);
  double sum = 0;
  int64_t count = 0, correct = 0;
  loom_status s = LOOM_OK;
  for (int64_t i = 0; i < loom_loader_batches_per_epoch(ld); i++) {
    const loom_batch *b;
    loom_tensor logits;
    loom_xent_stats st;
    if ((s = loom_loader_next(ld, &b)) != LOOM_OK ||
        (s = loom_model_forward(model, &b->x, &logits)) != LOOM_OK ||
        (s = loom_xent_forward(xent, &logits, (const int32_t *)b->y.data,
                               &st)) != LOOM_OK)
      break;
    sum += st.loss_sum;
    count += st.count;
    correct += st.correct;
  }
  loom_model_set_training(model, true);
  loom_loader_free(ld);
  *loss = count ? sum / (double)count : 0;
  *acc = count ? (double)correct / (double)count : 0;
  return s;
}

int main(int argc, char **argv) {
  int64_t steps = argc > 1 ? atoll(argv[1]) : 0;
  const char *ckpt_dir = argc > 2 ? argv[2] : NULL;
  int status = 0;
  loom_dataset *train = NULL, *test = NULL;
  loom_model *model = NULL;
  loom_xent *xent = NULL;
  loom_loader *loader = NULL;
  loom_optim *optim = NULL;

  /* Data: Fashion-MNIST from Debian's dataset-fashion-mnist. */
  loom_image_opts io = loom_image_opts_default();
  CHECK(loom_dataset_open_fashion(&train, NULL, LOOM_SPLIT_TRAIN, &io));
  CHECK(loom_dataset_open_fashion(&test, NULL, LOOM_SPLIT_VAL, &io));

  /* Model: 784-512-512-10 with ReLU; one flat parameter buffer. */
  loom_fashion_mlp_opts mo = loom_fashion_mlp_opts_default();
  loom_model_opts init = loom_model_opts_default();
  init.seed = 1;
  CHECK(loom_fashion_mlp_new(&model, &mo, &init));
  CHECK(loom_xent_new(&xent));

  /* A shuffled loader with a prefetching thread, batch 128. */
  loom_loader_opts lo = loom_loader_opts_default();
  lo.sampler.seed = 1;
  lo.sampler.batch = 128;
  CHECK(loom_loader_new(&loader, train, &lo));
  if (steps <= 0)
    steps = loom_loader_batches_per_epoch(loader);

  /* SGD with momentum 0.9, lr 0.05, over the flat buffers. */
  loom_optim_opts oo = loom_optim_opts_default();
  oo.kind = LOOM_OPTIM_SGD;
  oo.momentum = 0.9f;
  CHECK(loom_optim_new(&optim, &oo, loom_model_view(model, 0),
                       loom_model_num_views(model),
                       loom_model_num_params(model)));

  double t0 = loom_time_now();
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
                          loom_model_grads(model), 0.05f));
    if ((step + 1) % 100 == 0 || step + 1 == steps)
      printf("step %lld/%lld loss %.4f\n", (long long)(step + 1),
             (long long)steps, st.loss);
  }
  double secs = loom_time_now() - t0;

  double loss, acc;
  CHECK(evaluate(model, xent, test, &loss, &acc));
  printf("%lld steps in %.1f s (%.0f samples/s); test loss %.4f, test "
         "accuracy %.2f%%\n",
         (long long)steps, secs, (double)steps * 128 / secs, loss, 100 * acc);

  if (ckpt_dir) {
    loom_ckpt_meta meta = loom_ckpt_meta_default();
    meta.views = loom_model_view(model, 0);
    meta.n_views = loom_model_num_views(model);
    loom_ckpt_buffer buf = {"params", LOOM_F32, loom_model_num_params(model),
                            loom_model_params(model)};
    CHECK(loom_ckpt_save(ckpt_dir, steps, &meta, &buf, 1, 1));
    printf("saved %s/step_%08lld\n", ckpt_dir, (long long)steps);
  }

done:
  loom_optim_free(optim);
  loom_loader_free(loader);
  loom_xent_free(xent);
  loom_model_free(model);
  loom_dataset_free(test);
  loom_dataset_free(train);
  return status;
}
