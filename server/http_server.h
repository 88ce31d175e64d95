/* The HTTP side of tllm serve, on libmicrohttpd: routes, the API key, body and queue limits, JSON
 * answers and server-sent event streams. A thread per connection waits on its job (engine_thread.h)
 * and watches its socket, so a client that goes away ends its sequence at once. */
#ifndef TLLM_SRV_HTTP_SERVER_H
#define TLLM_SRV_HTTP_SERVER_H

#include <stddef.h>

#include "engine/run/generate.h"
#include "server/engine_thread.h"
#include "tokenizer/chat.h"

struct srv_params {
    const char *host;          /* an address to listen on (default 127.0.0.1) */
    int port;                  /* 0: any free port (srv_server_port says which) */
    const char *api_key;       /* NULL: no key asked */
    const char *model_name;    /* what /v1/models lists and answers name */
    size_t max_body;           /* bytes of a request body at most */
    int timeout_s;             /* a connection being answered whose client reads nothing is closed after this */
    double request_timeout;    /* seconds a connection has for a complete request (head and body), from its
                                  accept or its previous answer (conn_guard.h) */
    int max_waiting;           /* connections without a complete request at most, in all and per address */
    int max_waiting_per_ip;
    int max_connections;       /* connections at most (the daemon's threads): max_waiting plus room for answers */
    int n_ctx;                 /* positions one sequence may reach (prompt + answer) */
    const struct tllm_model *m;
    struct tllm_tok *tok;      /* NULL: no tokenizer (token-id prompts only) */
    const struct tllm_chat_template *tpl;
    const struct tllm_gen_defaults *gd; /* EOS ids */
    struct tllm_sampler_params sampling; /* defaults for what a request leaves out */
    const char *const *stop;   /* stop strings of requests that give none (at most 16) */
    int n_stop;
    int quiet;                 /* no line per request on stderr */
    struct srv_engine *engine;
};

struct srv_server;

/* Listen (the port is bound when this returns). */
int srv_server_start(struct srv_server **out, const struct srv_params *p);
int srv_server_port(const struct srv_server *s);
/* The server is stopping: connections are still accepted (a load balancer sees /health's 503, not a
 * hang), and every answer from now on closes its connection. */
void srv_server_drain(struct srv_server *s);
/* Wait up to wait_s seconds for the requests being answered to be answered (their jobs have ended or
 * been cancelled: each gets its answer, an error event and [DONE] for a stream), then close every
 * connection and free (the engine is the caller's). */
void srv_server_stop(struct srv_server *s, double wait_s);

#endif
