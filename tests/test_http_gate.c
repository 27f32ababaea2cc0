/* test_http_gate — http_gate_check_head: which request heads pass to libmicrohttpd and which
 * are refused (with what status) before it reads them. */
#include <string.h>

#include "server/http_gate.h"
#include "test.h"

static int check(const char *head) {
  char msg[160];
  msg[0] = 0;
  int st = http_gate_check_head(head, strlen(head), msg, sizeof msg);
  if (st) EXPECT_MSG(msg[0] != 0, "status %d without a message for %s", st, head);
  return st;
}

TEST(well_framed_heads_pass) {
  EXPECT(check("GET /health HTTP/1.1\r\nHost: x\r\n\r\n") == 0);
  EXPECT(check("GET /health HTTP/1.0\r\n\r\n") == 0);
  EXPECT(check("GET /health HTTP/1.1\nHost: x\n\n") == 0); /* bare LF line ends */
  EXPECT(check("\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n") == 0);
  EXPECT(check("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0012\r\n\r\n") == 0);
  EXPECT(check("POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-length:  7 \r\n\r\n") == 0);
  EXPECT(check("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n") ==
         0);
  EXPECT(check("POST /x HTTP/1.1\r\nContent-Length: 9223372036854775807\r\n\r\n") == 0);
  /* two Content-Lengths are server.c's to judge (400 when they disagree) */
  EXPECT(check("POST /x HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n") == 0);
  /* an incomplete head waits */
  EXPECT(check("GET /health HTTP/1.1\r\nHost: x\r\n") == 0);
  EXPECT(check("GET /hea") == 0);
}

TEST(framing_errors_refused) {
  EXPECT(check("GET /health\r\n\r\n") == 400);
  EXPECT(check("GET /health\r\n") == 400); /* a bad first line is refused at once */
  EXPECT(check("BLAH\r\n\r\n") == 400);
  EXPECT(check("GET  /health HTTP/1.1\r\n\r\n") == 400);
  EXPECT(check("GET /health HTTP/1.1 x\r\n\r\n") == 400);
  EXPECT(check("GET /health HTTP/2.0\r\n\r\n") == 505);
  EXPECT(check("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") == 505);
  EXPECT(check("GET /health HTTP/9.9\r\nHost: x\r\n\r\n") == 505);
  EXPECT(check("GET /health HTTP/1.1\r\nHost: x\r\nNoColon\r\n\r\n") == 400);
  EXPECT(check("GET /health HTTP/1.1\r\nBad Name: 1\r\n\r\n") == 400);
  EXPECT(check("GET /health HTTP/1.1\r\n: empty name\r\n\r\n") == 400);
  EXPECT(check("POST /x HTTP/1.1\r\nContent-Length: abc\r\n\r\n") == 400);
  EXPECT(check("POST /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n") == 400);
  EXPECT(check("POST /x HTTP/1.1\r\nContent-Length: \r\n\r\n") == 400);
  EXPECT(check("POST /x HTTP/1.1\r\nContent-Length: 1 2\r\n\r\n") == 400);
  EXPECT(check("POST /x HTTP/1.1\r\nContent-Length: 9223372036854775808\r\n\r\n") == 413);
  EXPECT(check("POST /x HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n") == 413);
  EXPECT(check("POST /x HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n") ==
         400);
  EXPECT(check("POST /x HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n") == 400);
}

TEST(too_many_headers_refused) {
  static char head[64 << 10];
  size_t n = (size_t)snprintf(head, sizeof head, "GET /health HTTP/1.1\r\nHost: x\r\n");
  for (int i = 0; i < 201; i++) n += (size_t)snprintf(head + n, sizeof head - n, "X-A: 1\r\n");
  snprintf(head + n, sizeof head - n, "\r\n");
  EXPECT(check(head) == 431);
}

int main(void) {
  RUN(well_framed_heads_pass);
  RUN(framing_errors_refused);
  RUN(too_many_headers_refused);
  TEST_MAIN_END();
}
