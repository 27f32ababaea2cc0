#include "server/http_gate.h"

#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "server/openai_request.h"
#include "server/openai_response.h"

#define GATE_PEEK (256u << 10) /* the head bytes looked at; a longer head passes unchecked */
#define GATE_MAX_HEADERS 200
#define GATE_MAX_HEADER_BYTES 65536
#define GATE_LINGER_S 2.0 /* after a refusal: the client's bytes are drained this long */

/* ======================================================================================
 * Head checks
 * ====================================================================================== */

/* The next line of [p, end): its end without CR LF in *eol, the next line in *next; 0 when
 * there is no complete line. */
static int gate_line(const char *p, const char *end, const char **eol, const char **next) {
  const char *nl = memchr(p, '\n', (size_t)(end - p));
  if (!nl) return 0;
  *eol = nl > p && nl[-1] == '\r' ? nl - 1 : nl;
  *next = nl + 1;
  return 1;
}

static int gate_tchar(unsigned char c) {
  return c > 32 && c < 127 && !strchr("\"(),/:;<=>?@[\\]{}", c);
}

static int gate_fail(char *msg, size_t msglen, int status, const char *text) {
  snprintf(msg, msglen, "%s", text);
  return status;
}

/* The value of a header line, trimmed, into v (NUL-terminated; cut at vlen - 1). */
static void gate_value(const char *colon, const char *eol, char *v, size_t vlen) {
  const char *a = colon + 1, *b = eol;
  while (a < b && (*a == ' ' || *a == '\t')) a++;
  while (b > a && (b[-1] == ' ' || b[-1] == '\t')) b--;
  size_t n = (size_t)(b - a) < vlen - 1 ? (size_t)(b - a) : vlen - 1;
  memcpy(v, a, n);
  v[n] = 0;
}

/* 0: pass or wait for more (*complete says whether the head ended); else a refusal. */
static int gate_scan(const char *buf, size_t n, int *complete, char *msg, size_t msglen) {
  const char *p = buf, *end = buf + n, *eol, *next;
  *complete = 0;
  while (p < end && (*p == '\r' || *p == '\n')) p++; /* empty lines before a request */
  if (!gate_line(p, end, &eol, &next)) return 0;
  /* request line: method SP target SP HTTP/d.d */
  const char *q = p;
  while (q < eol && gate_tchar((unsigned char)*q)) q++;
  if (q == p || q >= eol || *q != ' ') return gate_fail(msg, msglen, 400, "malformed request line");
  const char *t = ++q;
  while (q < eol && *q != ' ' && (unsigned char)*q > 32 && *q != 127) q++;
  if (q == t || q >= eol || *q != ' ') return gate_fail(msg, msglen, 400, "malformed request line");
  const char *ver = ++q;
  size_t vl = (size_t)(eol - ver);
  if (vl != 8 || memcmp(ver, "HTTP/", 5) || ver[5] < '0' || ver[5] > '9' || ver[6] != '.' ||
      ver[7] < '0' || ver[7] > '9')
    return gate_fail(msg, msglen, 400, "malformed request line");
  if (memcmp(ver, "HTTP/1.1", 8) && memcmp(ver, "HTTP/1.0", 8))
    return gate_fail(msg, msglen, 505, "HTTP version not supported: only HTTP/1.0 and HTTP/1.1");
  /* header lines */
  int n_headers = 0, have_cl = 0, have_te = 0, te_other = 0;
  size_t bytes = 0;
  for (p = next; gate_line(p, end, &eol, &next); p = next) {
    if (eol == p) { /* the blank line: the head is complete */
      *complete = 1;
      if (have_cl && have_te)
        return gate_fail(msg, msglen, 400,
                         "the request has both Content-Length and Transfer-Encoding");
      if (te_other)
        return gate_fail(msg, msglen, 400,
                         "Transfer-Encoding not supported: only chunked is understood");
      if (n_headers > GATE_MAX_HEADERS || bytes > GATE_MAX_HEADER_BYTES) {
        snprintf(msg, msglen, "the request has more than %d headers or %d bytes of them",
                 GATE_MAX_HEADERS, GATE_MAX_HEADER_BYTES);
        return 431;
      }
      return 0;
    }
    n_headers++;
    bytes += (size_t)(eol - p) + 2;
    if (*p == ' ' || *p == '\t') continue; /* an obsolete folded continuation */
    const char *colon = memchr(p, ':', (size_t)(eol - p));
    if (!colon || colon == p) return gate_fail(msg, msglen, 400, "malformed header line");
    for (const char *c = p; c < colon; c++)
      if (!gate_tchar((unsigned char)*c))
        return gate_fail(msg, msglen, 400, "malformed header line");
    size_t nl = (size_t)(colon - p);
    char v[64];
    if (nl == 14 && !strncasecmp(p, "Content-Length", 14)) {
      gate_value(colon, eol, v, sizeof v);
      size_t k = strspn(v, "0123456789");
      if (!v[0] || v[k]) return gate_fail(msg, msglen, 400, "Content-Length is not a number");
      const char *d = v;
      while (*d == '0' && d[1]) d++;
      if (strlen(d) > 19 || (strlen(d) == 19 && strcmp(d, "9223372036854775807") > 0))
        return gate_fail(msg, msglen, 413, "Content-Length is too large");
      have_cl = 1;
    } else if (nl == 17 && !strncasecmp(p, "Transfer-Encoding", 17)) {
      gate_value(colon, eol, v, sizeof v);
      have_te = 1;
      if (strcasecmp(v, "chunked")) te_other = 1;
    }
  }
  return 0;
}

int http_gate_check_head(const char *head, size_t len, char *msg, size_t msglen) {
  int complete;
  return gate_scan(head, len, &complete, msg, msglen);
}

/* ======================================================================================
 * The gate's thread
 * ====================================================================================== */

typedef struct pend pend;
struct pend {
  int fd;
  struct sockaddr_storage addr;
  socklen_t addrlen;
  double deadline;
  int closing; /* refused: draining the client's bytes until it closes or the linger ends */
  pend *next, *prev;
};

struct http_gate {
  http_gate_opts o;
  int ep;
  pthread_t th;
  atomic_int stop;
  pend *head; /* pending connections; owned */
  int n;
  char *buf; /* [GATE_PEEK] */
  int listen_tag;
};

static double gate_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void gate_unlink(http_gate *g, pend *p) {
  if (p->prev)
    p->prev->next = p->next;
  else
    g->head = p->next;
  if (p->next) p->next->prev = p->prev;
  g->n--;
  epoll_ctl(g->ep, EPOLL_CTL_DEL, p->fd, NULL);
}

static void gate_drop(http_gate *g, pend *p) {
  gate_unlink(g, p);
  close(p->fd);
  free(p);
}

static int gate_same_addr(const pend *p, const struct sockaddr_storage *a) {
  if (p->addr.ss_family != a->ss_family) return 0;
  if (a->ss_family == AF_INET)
    return ((const struct sockaddr_in *)&p->addr)->sin_addr.s_addr ==
           ((const struct sockaddr_in *)a)->sin_addr.s_addr;
  if (a->ss_family == AF_INET6)
    return !memcmp(&((const struct sockaddr_in6 *)&p->addr)->sin6_addr,
                   &((const struct sockaddr_in6 *)a)->sin6_addr, sizeof(struct in6_addr));
  return 0;
}

static void gate_discard(int fd, int *eof) {
  char tmp[4096];
  for (;;) {
    ssize_t r = recv(fd, tmp, sizeof tmp, MSG_DONTWAIT);
    if (r > 0) continue;
    if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) *eof = 1;
    return;
  }
}

static const char *gate_reason(int status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 413:
      return "Content Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Error";
  }
}

/* Answers a refused head with the error JSON and lets the connection linger until the client
 * closes (closing at once with its bytes unread would reset the answer away). */
static void gate_refuse(http_gate *g, pend *p, int status, const char *msg) {
  int eof = 0;
  gate_discard(p->fd, &eof);
  openai_error e;
  openai_error_set(&e, status, "invalid_request_error", NULL, "%s", msg);
  char *body = openai_response_error_body(&e);
  char head[256];
  int hl = snprintf(head, sizeof head,
                    "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: "
                    "%zu\r\nConnection: close\r\n\r\n",
                    status, gate_reason(status), body ? strlen(body) : 0);
  send(p->fd, head, (size_t)hl, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (body) send(p->fd, body, strlen(body), MSG_NOSIGNAL | MSG_DONTWAIT);
  free(body);
  shutdown(p->fd, SHUT_WR);
  if (eof) {
    gate_drop(g, p);
    return;
  }
  p->closing = 1;
  p->deadline = gate_now() + GATE_LINGER_S;
}

/* New bytes (or EOF) on a pending connection. */
static void gate_ready(http_gate *g, pend *p) {
  if (p->closing) {
    int eof = 0;
    gate_discard(p->fd, &eof);
    if (eof) gate_drop(g, p);
    return;
  }
  ssize_t r = recv(p->fd, g->buf, GATE_PEEK, MSG_PEEK | MSG_DONTWAIT);
  if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    gate_drop(g, p); /* gone before its head ended */
    return;
  }
  if (r < 0) return;
  char msg[160];
  int complete;
  int status = gate_scan(g->buf, (size_t)r, &complete, msg, sizeof msg);
  if (status) {
    gate_refuse(g, p, status, msg);
    return;
  }
  if (!complete && (size_t)r < GATE_PEEK) return; /* wait for the rest */
  gate_unlink(g, p);
  g->o.pass(g->o.user, p->fd, (const struct sockaddr *)&p->addr, p->addrlen);
  free(p);
}

static void gate_accept(http_gate *g) {
  for (;;) {
    struct sockaddr_storage a;
    socklen_t al = sizeof a;
    int fd = accept4(g->o.listen_fd, (struct sockaddr *)&a, &al, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        struct timespec ts = {0, 10 * 1000000L}; /* out of descriptors: let some close */
        nanosleep(&ts, NULL);
      }
      return;
    }
    int same = 0;
    for (pend *q = g->head; q && same < g->o.max_pending_per_addr; q = q->next)
      same += gate_same_addr(q, &a);
    pend *p =
        g->n < g->o.max_pending && same < g->o.max_pending_per_addr ? calloc(1, sizeof *p) : NULL;
    if (!p) {
      close(fd);
      continue;
    }
    p->fd = fd;
    p->addr = a;
    p->addrlen = al;
    p->deadline = gate_now() + g->o.head_timeout_s;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.ptr = p};
    if (epoll_ctl(g->ep, EPOLL_CTL_ADD, fd, &ev)) {
      close(fd);
      free(p);
      continue;
    }
    p->next = g->head;
    if (g->head) g->head->prev = p;
    g->head = p;
    g->n++;
    gate_ready(g, p); /* the head may be there already */
  }
}

static void *gate_main(void *arg) {
  http_gate *g = arg;
  struct epoll_event evs[64];
  while (!atomic_load(&g->stop)) {
    int n = epoll_wait(g->ep, evs, 64, 200);
    for (int i = 0; i < n; i++) {
      if (evs[i].data.ptr == &g->listen_tag)
        gate_accept(g);
      else
        gate_ready(g, evs[i].data.ptr);
    }
    double now = gate_now();
    for (pend *p = g->head, *nx; p; p = nx) {
      nx = p->next;
      if (now > p->deadline) gate_drop(g, p);
    }
  }
  return NULL;
}

int http_gate_start(http_gate **out, const http_gate_opts *o) {
  *out = NULL;
  http_gate *g = calloc(1, sizeof *g);
  if (!g) return -1;
  g->o = *o;
  g->buf = malloc(GATE_PEEK);
  g->ep = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &g->listen_tag};
  if (!g->buf || g->ep < 0 || epoll_ctl(g->ep, EPOLL_CTL_ADD, o->listen_fd, &ev) ||
      pthread_create(&g->th, NULL, gate_main, g)) {
    if (g->ep >= 0) close(g->ep);
    free(g->buf);
    free(g);
    return -1;
  }
  *out = g;
  return 0;
}

void http_gate_stop(http_gate *g) {
  if (!g) return;
  atomic_store(&g->stop, 1);
  pthread_join(g->th, NULL);
  while (g->head) gate_drop(g, g->head);
  close(g->o.listen_fd);
  close(g->ep);
  free(g->buf);
  free(g);
}
