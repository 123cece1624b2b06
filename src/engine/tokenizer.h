/* tokenizer.h - text <-> token ids, from the vocabulary a GGUF carries.
 *
 * Two models: byte-level BPE (tokenizer.ggml.model = "gpt2": GPT-2 byte-to-unicode
 * mapping, ranked merges, the pre-tokenizer regex named by tokenizer.ggml.pre, PCRE2)
 * and SentencePiece-style "llama" (scores, U+2581 for space, <0xNN> byte fallback).
 * Special/control tokens (token_type 3 or 4) are matched whole in the text when
 * parse_special is true.
 *
 * Thread safety: nothing in a loaded tokenizer is written again (the regex's match data is
 * made per call), so any number of threads may encode and decode with it at once: the engine
 * thread, and the HTTP threads for POST /tokenize, /detokenize and request validation. */
#ifndef TIDE_TOKENIZER_H
#define TIDE_TOKENIZER_H

#include "gguf.h"

struct tokenizer;

int tokenizer_load(struct tokenizer **out, const struct gguf_file *g, char *err, size_t errlen);
/* Build directly from arrays (tests): model "gpt2" or "llama"; merges may be NULL for
 * llama; scores may be NULL for gpt2; types may be NULL (all normal). pre may be NULL
 * (default GPT-2 regex). */
int tokenizer_create(struct tokenizer **out, const char *model, const char *pre,
                     const char *const *tokens, const float *scores, const int32_t *types,
                     uint32_t n_tokens, const char *const *merges, uint32_t n_merges);
void tokenizer_free(struct tokenizer *t);

uint32_t tokenizer_n_vocab(const struct tokenizer *t);
/* ids of bos/eos, -1 when the model has none. */
int tokenizer_bos(const struct tokenizer *t);
int tokenizer_eos(const struct tokenizer *t);
bool tokenizer_add_bos(const struct tokenizer *t);   /* tokenizer.ggml.add_bos_token */
/* Id of the token whose text is exactly s, or -1. */
int tokenizer_find(const struct tokenizer *t, const char *s);
/* End of generation: eos, eot, <|im_end|>, <|eot_id|>, </s> ... */
bool tokenizer_is_eog(const struct tokenizer *t, int id);
bool tokenizer_is_special(const struct tokenizer *t, int id);

/* Encode len bytes of text. *ids is malloc'd (caller frees), *n its length. No BOS is
 * added here. Linear in len: the text's UTF-8 is checked once (an invalid byte becomes a
 * piece of its own; the HTTP layer refuses such text before it gets here). cancel (may be
 * NULL) is polled every few hundred pieces: nonzero stops with TIDE_ECANCELED. */
int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, bool parse_special,
                     const volatile int *cancel, int **ids, int *n);

/* Work counters over every tokenizer in the process (tests check tokenising stays linear). */
struct tokenizer_counters {
    uint64_t utf8_bytes_checked;  /* bytes whose UTF-8 validity was checked, by us or PCRE2 */
    uint64_t match_calls;         /* pre-tokenizer regex matches run */
};
void tokenizer_get_counters(struct tokenizer_counters *c);
/* The raw bytes token id stands for (byte-level mapping undone, U+2581 -> space,
 * <0xNN> -> that byte; a special token gives its text). Returns the length, or a
 * negative code; writes at most cap bytes. */
int tokenizer_token_bytes(const struct tokenizer *t, int id, char *buf, size_t cap);

/* Streaming detokenizer: feed token bytes, get out only complete UTF-8 characters.
 * Invalid sequences are passed through as U+FFFD once it is clear they are invalid. */
struct utf8_stream {
    char pending[8];
    int n_pending;
};
/* Appends complete characters from the pending bytes + in to out. Every invalid byte can
 * become a 3-byte U+FFFD, so out must hold 3 * (len + 8) bytes. Returns bytes written. */
size_t utf8_stream_feed(struct utf8_stream *s, const char *in, size_t len, char *out);
/* Flush what is left at the end (as U+FFFD for an unfinished character). */
size_t utf8_stream_flush(struct utf8_stream *s, char *out);

#endif
