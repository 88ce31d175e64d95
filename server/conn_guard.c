/* tllm serve's connection guard (conn_guard.h). */
#include "server/conn_guard.h"

#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "base/clock.h"
#include "base/error.h"

/* How often the deadlines are looked at, and how often at most a summary line is written */
#ifndef SRV_GUARD_TICK_MS
#define SRV_GUARD_TICK_MS 100
#endif
#ifndef SRV_GUARD_LOG_EVERY_S
#define SRV_GUARD_LOG_EVERY_S 10.0
#endif

/* A client address without its port; an IPv4-mapped IPv6 address is its IPv4 address */
struct addr_key {
    int family;
    unsigned char b[16];
};

enum phase { WAITING, WORKING, CLOSING };

struct entry {
    struct entry *prev, *next;
    int fd;
    struct addr_key who;
    enum phase phase;
    double since; /* when the phase began (waiting: accept or the previous answer) */
};

struct srv_guard {
    struct srv_guard_params p;
    pthread_mutex_t lk;
    pthread_cond_t wake;
    struct entry *head, *tail;
    int n_working;
    long long timed_out, evicted, logged_timed_out, logged_evicted;
    double logged_at;
    int stopping;
    pthread_t watchdog;
};

static void addr_key_of(const struct sockaddr *a, struct addr_key *k) {
    memset(k, 0, sizeof *k);
    if (!a) return;
    k->family = a->sa_family;
    if (a->sa_family == AF_INET) {
        memcpy(k->b, &((const struct sockaddr_in *)a)->sin_addr, 4);
    } else if (a->sa_family == AF_INET6) {
        const struct in6_addr *x = &((const struct sockaddr_in6 *)a)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(x)) k->family = AF_INET, memcpy(k->b, x->s6_addr + 12, 4);
        else memcpy(k->b, x->s6_addr, 16);
    }
}

static int same_addr(const struct addr_key *a, const struct addr_key *b) {
    return a->family == b->family && !memcmp(a->b, b->b, sizeof a->b);
}

/* Under lk: the connection is closed (its thread sees the end of the stream and lets go of it) */
static void close_entry(struct entry *e) {
    shutdown(e->fd, SHUT_RDWR);
    e->phase = CLOSING;
}

/* Under lk: the waiting connection that has waited longest, of one address (who) or of all (NULL) */
static struct entry *oldest_waiting(struct srv_guard *g, const struct addr_key *who, int *n) {
    struct entry *best = NULL;
    *n = 0;
    for (struct entry *e = g->head; e; e = e->next) {
        if (e->phase != WAITING || (who && !same_addr(&e->who, who))) continue;
        ++*n;
        if (!best || e->since < best->since) best = e;
    }
    return best;
}

/* Under lk: a line for what was closed since the last one, at most every SRV_GUARD_LOG_EVERY_S unless forced */
static void maybe_log(struct srv_guard *g, double now, int force) {
    if (g->p.quiet || (!force && now - g->logged_at < SRV_GUARD_LOG_EVERY_S)) return;
    long long t = g->timed_out - g->logged_timed_out, v = g->evicted - g->logged_evicted;
    if (!t && !v) return;
    fprintf(stderr,
            "tllm serve: closed %lld connections that sent no complete request within %g s (--request-timeout) and %lld "
            "to make room for new ones (--max-waiting %d, --max-waiting-per-ip %d)\n",
            t, g->p.request_timeout, v, g->p.max_waiting, g->p.max_waiting_per_ip);
    g->logged_timed_out = g->timed_out, g->logged_evicted = g->evicted, g->logged_at = now;
}

static void *watchdog_main(void *arg) {
    struct srv_guard *g = arg;
    pthread_mutex_lock(&g->lk);
    while (!g->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += SRV_GUARD_TICK_MS * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L, ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&g->wake, &g->lk, &ts);
        double now = tllm_now();
        for (struct entry *e = g->head; e; e = e->next)
            if (e->phase == WAITING && now - e->since > g->p.request_timeout) {
                close_entry(e);
                g->timed_out++;
            }
        maybe_log(g, now, 0);
    }
    pthread_mutex_unlock(&g->lk);
    return NULL;
}

int srv_guard_init(struct srv_guard **out, const struct srv_guard_params *p) {
    *out = NULL;
    struct srv_guard *g = calloc(1, sizeof *g);
    if (!g) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    g->p = *p;
    g->logged_at = tllm_now() - SRV_GUARD_LOG_EVERY_S;
    pthread_mutex_init(&g->lk, NULL);
    pthread_cond_init(&g->wake, NULL);
    if (pthread_create(&g->watchdog, NULL, watchdog_main, g)) {
        pthread_mutex_destroy(&g->lk);
        pthread_cond_destroy(&g->wake);
        free(g);
        return tllm_fail(TLLM_ERR_NOMEM, "cannot start a thread");
    }
    *out = g;
    return TLLM_OK;
}

void srv_guard_free(struct srv_guard *g) {
    if (!g) return;
    pthread_mutex_lock(&g->lk);
    g->stopping = 1;
    pthread_cond_signal(&g->wake);
    pthread_mutex_unlock(&g->lk);
    pthread_join(g->watchdog, NULL);
    maybe_log(g, tllm_now(), 1);
    for (struct entry *e = g->head, *n; e; e = n) { /* none after the daemon's stop: its close notices came */
        n = e->next;
        free(e);
    }
    pthread_mutex_destroy(&g->lk);
    pthread_cond_destroy(&g->wake);
    free(g);
}

/* A new connection: room is made for it by closing the longest-waiting connection of its address
 * when that address is at its bound, else the longest-waiting of all when all are at theirs. */
enum MHD_Result srv_guard_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen) {
    (void)addrlen;
    struct srv_guard *g = cls;
    struct addr_key who;
    addr_key_of(addr, &who);
    pthread_mutex_lock(&g->lk);
    int n;
    struct entry *e = oldest_waiting(g, &who, &n);
    if (n < g->p.max_waiting_per_ip) e = oldest_waiting(g, NULL, &n), e = n < g->p.max_waiting ? NULL : e;
    if (e) {
        close_entry(e);
        g->evicted++;
    }
    pthread_mutex_unlock(&g->lk);
    return MHD_YES;
}

void srv_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code) {
    struct srv_guard *g = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        struct entry *e = calloc(1, sizeof *e);
        const union MHD_ConnectionInfo *fi = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ai = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        if (!e || !fi) { /* not tracked: no deadline for it, but the daemon's own limits stand */
            free(e);
            *socket_context = NULL;
            return;
        }
        e->fd = fi->connect_fd;
        addr_key_of(ai ? ai->client_addr : NULL, &e->who);
        e->phase = WAITING;
        e->since = tllm_now();
        pthread_mutex_lock(&g->lk);
        e->prev = g->tail;
        if (g->tail) g->tail->next = e;
        else g->head = e;
        g->tail = e;
        pthread_mutex_unlock(&g->lk);
        *socket_context = e;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        struct entry *e = *socket_context;
        if (!e) return;
        pthread_mutex_lock(&g->lk);
        if (e->phase == WORKING) g->n_working--;
        if (e->prev) e->prev->next = e->next;
        else g->head = e->next;
        if (e->next) e->next->prev = e->prev;
        else g->tail = e->prev;
        pthread_mutex_unlock(&g->lk);
        free(e);
        *socket_context = NULL;
    }
}

void srv_guard_working(struct srv_guard *g, struct MHD_Connection *c, int working) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct entry *e = ci ? ci->socket_context : NULL;
    if (!e) return;
    pthread_mutex_lock(&g->lk);
    if (e->phase != CLOSING && (e->phase == WORKING) != working) {
        g->n_working += working ? 1 : -1;
        e->phase = working ? WORKING : WAITING;
        e->since = tllm_now();
    }
    pthread_mutex_unlock(&g->lk);
}

int srv_guard_n_working(struct srv_guard *g) {
    pthread_mutex_lock(&g->lk);
    int n = g->n_working;
    pthread_mutex_unlock(&g->lk);
    return n;
}
