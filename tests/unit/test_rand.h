/* test_rand.h - the tests' one pseudo-random source (unit and GPU tests): xorshift64 from a seed
 * of the test file's own (TEST_RAND_SEED, defined before the include; else the default), so
 * every file's data is the same from run to run. frand: uniform in [-1, 1] on a grid of 1e-6;
 * test_rand_u: uniform in [0, 1) with 53 bits; test_rand_normal: a standard normal (Box-Muller). */
#ifndef TIDE_TEST_RAND_H
#define TIDE_TEST_RAND_H

#include <math.h>
#include <stdint.h>

#ifndef TEST_RAND_SEED
#define TEST_RAND_SEED 0x9e3779b97f4a7c15ULL
#endif

static uint64_t rng = TEST_RAND_SEED;

static inline uint64_t test_rand_next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static inline double test_rand_u(void) { return (double)(test_rand_next() >> 11) * 0x1p-53; }

static inline double test_rand_normal(void)
{
    return sqrt(-2.0 * log(test_rand_u() + 1e-300)) * cos(6.283185307179586 * test_rand_u());
}

static inline float frand(void) { return (float)((test_rand_next() >> 16) % 2000001) / 1000000.0f - 1.0f; }

#endif
