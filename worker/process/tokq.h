/*
 * tokq.h — the worker's tokenizer thread: text (a Generate's prompt, a Tokenize request) is
 * turned into token ids beside the serving loop, so a large text never stalls the engine's
 * steps, the other tenants' streams or the heartbeats (issue 15: a 3.9 MB prompt stalled
 * another stream 2.3 s; a 60 MB one got its worker killed as hung).
 *
 * The serving loop (one thread) pushes jobs and takes finished ones; only it touches the
 * engine and the rings. Jobs are done in order, one at a time.
 */
#ifndef CLOCHER_WORKER_TOKQ_H
#define CLOCHER_WORKER_TOKQ_H

#include "chat.h"
#include "msg.h"
#include "tok.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum tokq_kind { TOKQ_GENERATE, TOKQ_TOKENIZE };

struct tokq_job {
    struct tokq_job *next;
    enum tokq_kind kind;
    uint64_t request_id;
    bool cancelled;                /* cancelled while queued: dropped when done */
    /* TOKQ_GENERATE: the request, its strings owned by the job (gen.prompt_text = text) */
    struct shm_msg_generate gen;
    char *text;                    /* [text_len] */
    uint32_t text_len;
    bool add_bos;
    /* the result */
    int rc;                        /* 0, or tok_encode's error */
    char error[256];               /* its message */
    int32_t *ids;                  /* [n_ids], malloc'd */
    size_t n_ids;
};

struct tokq;

/* Starts the thread over tok (shared: a struct tok is immutable). */
int tokq_create(const struct tok *tok, struct tokq **out);
/* The chat template GENERATEs with SHM_GEN_CHAT are rendered with (chat.h); why: the message
 * a CHAT_TPL_NONE refusal gives. Call before pushing jobs. Default: CHAT_TPL_NONE. */
void tokq_set_chat(struct tokq *q, enum chat_template tpl, const char *why);
/* Stops the thread (after its current job) and frees every job. NULL is a no-op. */
void tokq_destroy(struct tokq *q);
/* A job for a Generate with text (every string copied); NULL when out of memory. */
struct tokq_job *tokq_job_generate(const struct shm_msg_generate *g);
/* A job for a Tokenize; NULL when out of memory. */
struct tokq_job *tokq_job_tokenize(const struct shm_msg_tokenize *t);
void tokq_job_free(struct tokq_job *j);
/* Queues j (the queue owns it until tokq_take returns it). */
void tokq_push(struct tokq *q, struct tokq_job *j);
/* The next finished job (the caller owns it), NULL if none. */
struct tokq_job *tokq_take(struct tokq *q);
/* Jobs queued or running, not yet taken. */
size_t tokq_pending(struct tokq *q);
/* Marks request_id's job cancelled; false if no job has it. */
bool tokq_cancel(struct tokq *q, uint64_t request_id);

#endif
