/* model_config.h - internal to the model loader: model.c's calls into model_config.c, which
 * reads and checks a GGUF text model's hyper-parameters into struct model_config before the
 * tensors are bound against them. Not for the rest of the engine (model.h is). */
#ifndef TIDE_MODEL_CONFIG_H
#define TIDE_MODEL_CONFIG_H

#include "model.h"

/* m->cfg from m->gguf's keys: the architecture, the shared hyper-parameters and each
 * architecture's own; 0, or a negative code with the reason in err. */
int model_load_config(struct model *m, char *err, size_t errlen);

/* gpt-oss's and deepseek2's rope scaling (arch: the key prefix) into m->rope_freqs (owned,
 * n_rot / 2 floats) and cfg.rope_mscale; after model_load_config. */
int model_load_rope_scaling(struct model *m, const char *arch, char *err, size_t errlen);

#endif
