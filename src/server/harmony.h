/* harmony.h - gpt-oss's reply format (harmony) split for the chat API: the generated text,
 * channel markers included, "<|channel|>analysis<|message|>...<|end|><|start|>assistant
 * <|channel|>final<|message|>...", becomes the final channel's text (message.content) and the
 * analysis channel's (message.reasoning_content). Used for chat completions of a model whose
 * template is gpt-oss's when no tools are active (tools parse the raw text themselves). */
#ifndef TIDE_HARMONY_H
#define TIDE_HARMONY_H

#include <stdbool.h>
#include <stddef.h>

struct cJSON;

struct harmony_split {
    char *content, *reasoning; /* malloc'd, NUL-terminated; lengths below (text may hold NULs) */
    size_t content_len, reasoning_len;
};

/* Whether text[0..len) is harmony: it begins with <|channel|> or <|start|> (or, while short,
 * with a prefix of one). A reply that does not is passed through as content, unchanged. */
bool harmony_text(const char *text, size_t len);
/* Split text[0..len): message bodies of the analysis channel into reasoning, of any other
 * channel (final, commentary) into content; headers and markers dropped. Unless complete, a
 * trailing partial marker is held back, so that a longer text's split only extends this one's.
 * Returns 0 or TIDE_ENOMEM. */
int harmony_split(const char *text, size_t len, bool complete, struct harmony_split *out);
void harmony_split_free(struct harmony_split *h);

/* Streaming: the text so far (len bytes, complete at the end) against what went out before
 * (*sent_content, *sent_reasoning bytes of the split, advanced here): adds the new parts to
 * delta as "reasoning_content" and "content". Returns whether it added anything, or
 * TIDE_ENOMEM. */
int harmony_stream_delta(const char *text, size_t len, bool complete, size_t *sent_content, size_t *sent_reasoning,
                         struct cJSON *delta);

/* harmony_stream_delta of an incomplete text into a new object: NULL when there is nothing
 * new (or no memory: the rest goes out with a later piece). */
struct cJSON *harmony_stream_next(const char *text, size_t len, size_t *sent_content, size_t *sent_reasoning);
/* A whole reply: when text is harmony, its split into message m ("content", and
 * "reasoning_content" when there is any) and 1; 0 (nothing added) when it is not; TIDE_ENOMEM. */
int harmony_message(struct cJSON *m, const char *text, size_t len);

#endif
