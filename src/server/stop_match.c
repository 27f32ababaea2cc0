#include "server/stop_match.h"

#include <stdlib.h>
#include <string.h>

/* One trie node: the prefix of some stop string spelled by the path from the root. A node has
 * at most n_stops children (each child lies on some stop string), kept as a sibling list. */
typedef struct sm_node {
  int first_child, next_sibling; /* -1: none */
  int fail;                      /* the longest proper suffix that is also a node */
  int dict;                      /* the nearest node down the fail chain that ends a stop; -1 */
  int word;                      /* the first-listed stop string ending here; -1 */
  int depth;                     /* bytes from the root */
  unsigned char c;               /* the byte on the edge into this node */
} sm_node;

struct stop_match {
  sm_node *nodes; /* [n_nodes]; 0 is the root */
  int n_nodes;
  int state; /* the node of the text fed so far */
  unsigned long long steps;
};

static int child_of(const stop_match *m, int node, unsigned char c) {
  for (int k = m->nodes[node].first_child; k >= 0; k = m->nodes[k].next_sibling)
    if (m->nodes[k].c == c) return k;
  return -1;
}

static int add_node(stop_match *m, int parent, unsigned char c) {
  sm_node *n = &m->nodes[m->n_nodes];
  n->first_child = -1;
  n->next_sibling = m->nodes[parent].first_child;
  n->fail = 0;
  n->dict = -1;
  n->word = -1;
  n->depth = m->nodes[parent].depth + 1;
  n->c = c;
  m->nodes[parent].first_child = m->n_nodes;
  return m->n_nodes++;
}

stop_match *stop_match_new(char *const *stops, int n_stops) {
  stop_match *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  size_t total = 1;
  for (int i = 0; i < n_stops; i++) total += strlen(stops[i]);
  m->nodes = malloc(sizeof *m->nodes * total);
  int *queue = malloc(sizeof *queue * total);
  if (!m->nodes || !queue) {
    free(queue);
    stop_match_free(m);
    return NULL;
  }
  memset(&m->nodes[0], 0, sizeof m->nodes[0]);
  m->nodes[0].first_child = m->nodes[0].next_sibling = m->nodes[0].dict = m->nodes[0].word = -1;
  m->n_nodes = 1;
  for (int i = 0; i < n_stops; i++) {
    const unsigned char *s = (const unsigned char *)stops[i];
    if (!s[0]) continue;
    int node = 0;
    for (; *s; s++) {
      int k = child_of(m, node, *s);
      node = k >= 0 ? k : add_node(m, node, *s);
    }
    if (m->nodes[node].word < 0) m->nodes[node].word = i;
  }
  /* fail and dict links, breadth first: a node's links come from shallower nodes */
  int head = 0, tail = 0;
  for (int k = m->nodes[0].first_child; k >= 0; k = m->nodes[k].next_sibling) queue[tail++] = k;
  while (head < tail) {
    int u = queue[head++];
    for (int v = m->nodes[u].first_child; v >= 0; v = m->nodes[v].next_sibling) {
      int f = m->nodes[u].fail, g;
      while ((g = child_of(m, f, m->nodes[v].c)) < 0 && f != 0) f = m->nodes[f].fail;
      m->nodes[v].fail = g >= 0 ? g : 0;
      int fv = m->nodes[v].fail;
      m->nodes[v].dict = m->nodes[fv].word >= 0 ? fv : m->nodes[fv].dict;
      queue[tail++] = v;
    }
  }
  free(queue);
  return m;
}

void stop_match_free(stop_match *m) {
  if (!m) return;
  free(m->nodes);
  free(m);
}

long stop_match_feed(stop_match *m, const char *bytes, size_t n, size_t base, size_t *match_len) {
  long best = -1;
  int best_word = -1;
  size_t best_len = 0;
  int st = m->state;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)bytes[i];
    int k;
    while ((k = child_of(m, st, c)) < 0 && st != 0) {
      st = m->nodes[st].fail;
      m->steps++;
    }
    st = k >= 0 ? k : 0;
    m->steps++;
    size_t end = base + i + 1;
    for (int t = m->nodes[st].word >= 0 ? st : m->nodes[st].dict; t >= 0; t = m->nodes[t].dict) {
      m->steps++;
      long start = (long)(end - (size_t)m->nodes[t].depth);
      int w = m->nodes[t].word;
      if (best < 0 || start < best || (start == best && w < best_word)) {
        best = start;
        best_word = w;
        best_len = (size_t)m->nodes[t].depth;
      }
    }
  }
  m->state = st;
  if (match_len) *match_len = best_len;
  return best;
}

size_t stop_match_holdback(const stop_match *m) { return (size_t)m->nodes[m->state].depth; }

unsigned long long stop_match_steps(const stop_match *m) { return m->steps; }
