/* What keeps slow and idle connections from starving tllm serve. libmicrohttpd runs a thread per
 * connection and calls the server only once a request's head is complete, and its timeout is an idle
 * one: a client sending a header byte every few seconds would hold a thread for ever, and enough of
 * them would fill every slot before any key is checked. So each connection is tracked from accept to
 * close, by phase:
 *   waiting  - no complete request yet: the head (and then the body) is arriving, or it is idle
 *              between keep-alive requests. Such a connection has a deadline (the request timeout,
 *              counted from its accept or its previous answer, whatever it sends meanwhile), and
 *              waiting ones are bounded per client address and in total: at either bound the
 *              oldest is closed to make room for the new one.
 *   working  - the request is complete and being answered (no deadline: answers may stream for
 *              minutes; the daemon's idle timeout still closes a client that stops reading).
 * Closing is shutdown() on the socket, under the registry's lock, which the daemon's close
 * notification also takes, so the descriptor cannot have been reused meanwhile. */
#ifndef TLLM_SRV_CONN_GUARD_H
#define TLLM_SRV_CONN_GUARD_H

#include <microhttpd.h>

struct srv_guard_params {
    int max_waiting;        /* connections without a complete request, at most, in all */
    int max_waiting_per_ip; /* ... from one client address */
    double request_timeout; /* seconds from accept (or the previous answer) to a complete request */
    int quiet;              /* no summary lines on stderr */
};

struct srv_guard;

int srv_guard_init(struct srv_guard **out, const struct srv_guard_params *p);
/* After the daemon has stopped (no callback runs any more) */
void srv_guard_free(struct srv_guard *g);

/* The daemon's callbacks (MHD_start_daemon's apc and MHD_OPTION_NOTIFY_CONNECTION, with g as cls) */
enum MHD_Result srv_guard_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen);
void srv_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code);

/* A connection's request became complete (working: 1) or was answered (waiting for the next: 0) */
void srv_guard_working(struct srv_guard *g, struct MHD_Connection *c, int working);

/* Connections answering a request now */
int srv_guard_n_working(struct srv_guard *g);

#endif
