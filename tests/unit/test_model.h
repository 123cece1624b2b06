/* test_model.h - a unit test's model: tide-mkmodel's preset (modelgen, one thread, so the same
 * options give the same bytes) written to a file under /tmp named by the test, the preset, the
 * type and the process, then loaded. path (path_size bytes) gets the file's name, for unlink. */
#ifndef TIDE_TEST_MODEL_H
#define TIDE_TEST_MODEL_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <unistd.h>

#include "engine/model.h"
#include "engine/modelgen.h"

static inline void test_model_load(struct model *m, char *path, size_t path_size, const char *test, const char *preset,
                                   int type, uint64_t seed)
{
    snprintf(path, path_size, "/tmp/tide-test-%s-%d-%s-%d.gguf", test, (int)getpid(), preset, type);
    struct modelgen_options o = {.preset = preset, .out = path, .seed = seed, .type = type, .threads = 1};
    struct modelgen_summary sum;
    char err[256] = "";
    cr_assert_eq(modelgen_write(&o, &sum, err, sizeof err), 0, "modelgen %s: %s", preset, err);
    cr_assert_eq(model_load(m, path, err, sizeof err), 0, "model_load %s: %s", preset, err);
}

#endif
