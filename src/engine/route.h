/* route.h - top-k MoE routing of router logits, on the host.
 *
 * For n tokens' router logits (n, n_expert): out receives sel (n, k) int32, each token's k
 * experts in ascending index order, then w (n, k) f32, their weights (softmax over all
 * experts, the top k kept, ties to the lower index, renormalised over the k when norm). This
 * is backend_i.route's contract; the CPU backend runs it as is and the CUDA kernel follows it
 * step for step. k outside 1..64 or above n_expert: out is left untouched. */
#ifndef TIDE_ROUTE_H
#define TIDE_ROUTE_H

#include <stdbool.h>
#include <stdint.h>

void route_topk(const float *logits, int n, int n_expert, int k, bool norm, int32_t *out);

#endif
