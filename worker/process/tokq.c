/*
 * tokq.c — the worker's tokenizer thread (see tokq.h): a FIFO of jobs guarded by one mutex,
 * a condition variable to wake the thread, and a list of finished jobs the serving loop takes.
 */
#include "tokq.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tokq {
    const struct tok *tok;
    enum chat_template chat;       /* set before any job: read by the thread without mu */
    char chat_why[256];
    pthread_t thread;
    pthread_mutex_t mu;            /* guards everything below */
    pthread_cond_t cv;
    bool stop;
    struct tokq_job *head, *tail;  /* queued */
    struct tokq_job *running;
    struct tokq_job *done_head, *done_tail;
    size_t pending;                /* queued + running + done, not yet taken */
};

static void append(struct tokq_job **head, struct tokq_job **tail, struct tokq_job *j)
{
    j->next = NULL;
    if (*tail)
        (*tail)->next = j;
    else
        *head = j;
    *tail = j;
}

static void *tokq_main(void *arg)
{
    struct tokq *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->stop && !q->head)
            pthread_cond_wait(&q->cv, &q->mu);
        if (q->stop)
            break;
        struct tokq_job *j = q->head;
        q->head = j->next;
        if (!q->head)
            q->tail = NULL;
        q->running = j;
        bool skip = j->cancelled;
        pthread_mutex_unlock(&q->mu);
        if (!skip) {
            log_clear_error();
            if (j->kind == TOKQ_GENERATE && (j->gen.flags & SHM_GEN_CHAT)) {
                if (q->chat == CHAT_TPL_NONE) {
                    j->rc = ERR_UNSUPPORTED;
                    snprintf(j->error, sizeof j->error, "%s", q->chat_why);
                } else {
                    j->rc = chat_render(q->tok, q->chat, j->text, j->text_len, j->gen.flags,
                                        &j->ids, &j->n_ids, j->error, sizeof j->error);
                }
            } else {
                j->rc = tok_encode(q->tok, j->text, j->text_len, j->add_bos, &j->ids,
                                   &j->n_ids);
                if (j->rc < 0)
                    snprintf(j->error, sizeof j->error, "%s", log_last_error());
            }
        }
        pthread_mutex_lock(&q->mu);
        q->running = NULL;
        append(&q->done_head, &q->done_tail, j);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

int tokq_create(const struct tok *tok, struct tokq **out)
{
    *out = NULL;
    struct tokq *q = calloc(1, sizeof *q);
    if (!q)
        return -ENOMEM;
    q->tok = tok;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    int e = pthread_create(&q->thread, NULL, tokq_main, q);
    if (e != 0) {
        /* pthread_create returns its error; errno is not set */
        LOG_ERR("tokenizer thread: pthread_create: %s", strerror(e));
        pthread_cond_destroy(&q->cv);
        pthread_mutex_destroy(&q->mu);
        free(q);
        return -e;
    }
    *out = q;
    return 0;
}

static void free_list(struct tokq_job *j)
{
    while (j) {
        struct tokq_job *next = j->next;
        tokq_job_free(j);
        j = next;
    }
}

void tokq_set_chat(struct tokq *q, enum chat_template tpl, const char *why)
{
    q->chat = tpl;
    snprintf(q->chat_why, sizeof q->chat_why, "%s", why ? why : "");
}

void tokq_destroy(struct tokq *q)
{
    if (!q)
        return;
    pthread_mutex_lock(&q->mu);
    q->stop = true;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->thread, NULL);
    free_list(q->head);
    free_list(q->done_head);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

void tokq_job_free(struct tokq_job *j)
{
    if (!j)
        return;
    free(j->text);
    free((char *)j->gen.adapter);
    for (uint32_t i = 0; i < j->gen.n_stop; i++)
        free((char *)j->gen.stop[i]);
    free(j->ids);
    free(j);
}

static struct tokq_job *job_new(enum tokq_kind kind, uint64_t id, const char *text,
                                uint32_t len, bool add_bos)
{
    struct tokq_job *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->kind = kind;
    j->request_id = id;
    j->add_bos = add_bos;
    j->text_len = len;
    if (!(j->text = malloc(len ? len : 1))) {
        free(j);
        return NULL;
    }
    memcpy(j->text, text, len);
    return j;
}

struct tokq_job *tokq_job_generate(const struct shm_msg_generate *g)
{
    struct tokq_job *j = job_new(TOKQ_GENERATE, g->request_id, g->prompt_text,
                                 g->prompt_text_len, (g->flags & SHM_GEN_ADD_BOS) != 0);
    if (!j)
        return NULL;
    j->gen = *g;
    j->gen.prompt_text = j->text;
    j->gen.prompt_ids = NULL, j->gen.n_prompt_ids = 0;
    j->gen.adapter = NULL;
    j->gen.n_stop = 0;
    bool ok = true;
    if (g->adapter)
        ok = (j->gen.adapter = strdup(g->adapter)) != NULL;
    for (uint32_t i = 0; ok && i < g->n_stop; i++) {
        if ((j->gen.stop[i] = strdup(g->stop[i])))
            j->gen.n_stop = i + 1;
        else
            ok = false;
    }
    if (!ok) {
        tokq_job_free(j);
        return NULL;
    }
    return j;
}

struct tokq_job *tokq_job_tokenize(const struct shm_msg_tokenize *t)
{
    return job_new(TOKQ_TOKENIZE, t->request_id, t->text, t->text_len,
                   (t->flags & SHM_GEN_ADD_BOS) != 0);
}

void tokq_push(struct tokq *q, struct tokq_job *j)
{
    pthread_mutex_lock(&q->mu);
    append(&q->head, &q->tail, j);
    q->pending++;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

struct tokq_job *tokq_take(struct tokq *q)
{
    pthread_mutex_lock(&q->mu);
    struct tokq_job *j = q->done_head;
    if (j) {
        q->done_head = j->next;
        if (!q->done_head)
            q->done_tail = NULL;
        j->next = NULL;
        q->pending--;
    }
    pthread_mutex_unlock(&q->mu);
    return j;
}

size_t tokq_pending(struct tokq *q)
{
    pthread_mutex_lock(&q->mu);
    size_t n = q->pending;
    pthread_mutex_unlock(&q->mu);
    return n;
}

bool tokq_cancel(struct tokq *q, uint64_t request_id)
{
    bool found = false;
    pthread_mutex_lock(&q->mu);
    struct tokq_job *lists[2] = {q->head, q->done_head};
    for (int l = 0; l < 2 && !found; l++)
        for (struct tokq_job *j = lists[l]; j; j = j->next)
            if (j->request_id == request_id) {
                j->cancelled = found = true;
                break;
            }
    if (!found && q->running && q->running->request_id == request_id)
        q->running->cancelled = found = true;
    pthread_mutex_unlock(&q->mu);
    return found;
}
