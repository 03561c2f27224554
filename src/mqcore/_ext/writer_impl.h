/*
 * A background pwrite() worker: one POSIX thread that writes queued (buffer, length, position)
 * jobs to a file descriptor, in order, while the submitting thread goes on encoding.
 *
 * Appends use it to overlap the encoding (copy, varints, CRC) of a batch's next chunk with the
 * write of the previous one (batch.pyx "Streaming"). The submitter owns every buffer until
 * mq_writer_drain() has returned: the worker only reads them.
 *
 * Errors: the first failed write's errno is kept; later jobs are skipped, and drain returns it.
 * Fork: the worker does not exist in a child; mq_writer_ready() sees the pid change and the
 * state is rebuilt from scratch (the child never touches the parent's possibly held mutex).
 */
#ifndef MQCORE_WRITER_IMPL_H
#define MQCORE_WRITER_IMPL_H

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define MQ_WRITER_RING 64

typedef struct {
    const char *data;
    size_t len;
    int64_t position;
    int fd;
} mq_write_job;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t work;    /* jobs queued, or stop */
    pthread_cond_t room;    /* a job finished: ring space, or idle */
    mq_write_job ring[MQ_WRITER_RING];
    unsigned head;          /* next job to write */
    unsigned tail;          /* next free slot; head == tail: empty */
    int busy;               /* the worker holds a job outside the lock */
    int error;              /* first errno, 0 if none */
    int stop;
    int running;
    pid_t owner;            /* the process the thread belongs to */
    pthread_t thread;
} mq_writer;

static int mq_write_all(const mq_write_job *job)
{
    const char *p = job->data;
    size_t left = job->len;
    int64_t at = job->position;
    while (left) {
        ssize_t w = pwrite(job->fd, p, left, (off_t)at);
        if (w < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return errno;
        }
        if (w == 0)
            return ENOSPC; /* no progress */
        p += w;
        at += w;
        left -= (size_t)w;
    }
    return 0;
}

static void *mq_writer_main(void *arg)
{
    mq_writer *w = (mq_writer *)arg;
    mq_write_job job;
    int err;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->head == w->tail && !w->stop)
            pthread_cond_wait(&w->work, &w->mu);
        if (w->head == w->tail)
            break; /* stop, and nothing left */
        job = w->ring[w->head % MQ_WRITER_RING];
        w->busy = 1;
        err = 0;
        if (!w->error) {
            pthread_mutex_unlock(&w->mu);
            err = mq_write_all(&job);
            pthread_mutex_lock(&w->mu);
        }
        if (err && !w->error)
            w->error = err;
        w->head++;
        w->busy = 0;
        pthread_cond_signal(&w->room);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* A stopped writer; mq_writer_ready() starts the thread on first use. */
static void mq_writer_init(mq_writer *w)
{
    memset(w, 0, sizeof(*w));
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->work, NULL);
    pthread_cond_init(&w->room, NULL);
}

/* Start the thread if this process has none yet; 0 or an errno. */
static int mq_writer_ready(mq_writer *w)
{
    int err;
    if (w->running && w->owner == getpid())
        return 0;
    if (w->running) /* inherited through fork: the thread is gone, the lock state unknown */
        mq_writer_init(w);
    w->head = w->tail = 0;
    w->error = w->stop = w->busy = 0;
    err = pthread_create(&w->thread, NULL, mq_writer_main, w);
    if (err)
        return err;
    w->running = 1;
    w->owner = getpid();
    return 0;
}

/* Queue one write; waits while the ring is full. */
static void mq_writer_submit(mq_writer *w, int fd, const char *data, size_t len, int64_t position)
{
    mq_write_job *job;
    if (len == 0)
        return;
    pthread_mutex_lock(&w->mu);
    while (w->tail - w->head == MQ_WRITER_RING)
        pthread_cond_wait(&w->room, &w->mu);
    job = &w->ring[w->tail % MQ_WRITER_RING];
    job->data = data;
    job->len = len;
    job->position = position;
    job->fd = fd;
    w->tail++;
    pthread_cond_signal(&w->work);
    pthread_mutex_unlock(&w->mu);
}

/* Wait until every queued job is written (or skipped after an error); returns and clears the
   first errno (0: all written). Afterwards the worker touches none of the submitted buffers. */
static int mq_writer_drain(mq_writer *w)
{
    int err;
    if (!w->running)
        return 0;
    pthread_mutex_lock(&w->mu);
    while (w->head != w->tail || w->busy)
        pthread_cond_wait(&w->room, &w->mu);
    err = w->error;
    w->error = 0;
    pthread_mutex_unlock(&w->mu);
    return err;
}

/* Finish the queued jobs and join the thread (a no-op for a writer of another process). */
static void mq_writer_stop(mq_writer *w)
{
    if (!w->running || w->owner != getpid())
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_signal(&w->work);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    w->running = 0;
}

#endif
