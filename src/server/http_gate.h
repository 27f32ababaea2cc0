/* http_gate — the listener, and the first request head of every connection, checked before
 * libmicrohttpd sees it.
 *
 *   accept ──> pending (one epoll thread, no thread per connection)
 *                 │  peek (MSG_PEEK: the bytes stay for libmicrohttpd) until the head ends
 *                 ├─ framing error: the OpenAI error JSON, "Connection: close", then closed
 *                 ├─ no complete head within head_timeout_s, or EOF: closed
 *                 └─ head well framed (or larger than the peek window): pass(fd) -> libmicrohttpd
 *
 * libmicrohttpd answers the framing errors it finds itself with its own HTML (and offers no
 * hook), so the gate finds them first: a malformed request line or header line, an HTTP
 * version other than 1.0 / 1.1 (505), a Content-Length that is not a number (400) or too
 * large (413), Content-Length with Transfer-Encoding (400), a transfer coding other than
 * chunked (400: a client error, as the server's own failures are the only 5xx), more than 200
 * header lines or 64 KiB of them (431). A slow head costs a
 * socket here, never a thread, and has head_timeout_s in all, however it trickles. */
#ifndef DS_HTTP_GATE_H
#define DS_HTTP_GATE_H
#include <stddef.h>
#include <sys/socket.h>

typedef struct http_gate http_gate;

/* Hands a connection whose head passed to the HTTP server, which owns fd from then on (closes
 * it on failure). */
typedef void (*http_gate_pass_fn)(void *user, int fd, const struct sockaddr *addr,
                                  socklen_t addrlen);

typedef struct http_gate_opts {
  int listen_fd;            /* bound and listening; the gate owns it (closes it at stop) */
  double head_timeout_s;    /* a head not complete by then: the connection is closed */
  int max_pending;          /* connections whose head is pending, in all */
  int max_pending_per_addr; /* of them, from one address */
  http_gate_pass_fn pass;
  void *user;
} http_gate_opts;

/* Starts the gate's thread. Returns 0, or -1 (out of memory, no thread). */
int http_gate_start(http_gate **out, const http_gate_opts *o);
/* Stops accepting (closes the listener and the pending connections) and joins the thread;
 * NULL: nothing. */
void http_gate_stop(http_gate *g);

/* Checks a request head (bytes up to and with its blank line; a complete first line is
 * enough for a malformed one). Returns 0 when it may pass, or the HTTP status of its
 * refusal with a message in msg. For tests too. */
int http_gate_check_head(const char *head, size_t len, char *msg, size_t msglen);

#endif
