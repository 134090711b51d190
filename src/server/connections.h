#pragma once
// The server's TCP connections seen from outside cpp-httplib, which (0.11) hands its handlers no
// socket: they are found among this process's descriptors by their two ends (a TCP connection is
// unique by them).
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace dsv4::server {

struct Peer {
  std::string addr;  // numeric, as cpp-httplib's Request::remote_addr
  int port = -1;
  bool operator<(const Peer& o) const { return port != o.port ? port < o.port : addr < o.addr; }
  bool operator==(const Peer& o) const { return port == o.port && addr == o.addr; }
};

// Calls fn(fd, peer) for every connected TCP socket of this process whose local port is `port`.
void for_each_connection(int port, const std::function<void(int fd, const Peer& peer)>& fn);
// The socket of the connection between local `port` and `peer`, or -1. It stays valid while the
// handler of a request on it runs: the handler's thread owns the connection.
int connection_fd(int port, const Peer& peer);
// Sets the backlog of this process's listening socket on `port` (false: none found). The kernel
// queues that many connections the server has not accepted yet; cpp-httplib 0.11 (Debian's
// shared library, its CPPHTTPLIB_LISTEN_BACKLOG fixed at build) asks for 5. Past the backlog, new
// handshakes go by SYN cookies, and a client that sent more than one segment before the server
// accepted it is reset: 49 of 64 clients connecting while the process was stopped for 2 s.
bool widen_listen_backlog(int port, int backlog);
// Whether the client closed its end (end of stream or a reset) without reading a byte of it: a
// peek that does not wait. HTTP/1.1 clients do not half-close while awaiting an answer.
bool peer_closed(int fd);

// Closes connections on which no complete request arrived within `limit` of their start or of
// their previous answer. cpp-httplib serves each connection on a thread of a fixed pool and
// bounds only the wait for each read, so without this, clients that trickle a request a byte at a
// time hold those threads for as long as they like and the server stops answering. A connection
// is busy (exempt) from its handler's start (enter, once the request is read) to the end of its
// answer (leave); the others are checked once a second, so the limit holds to about a second.
// A connection accepted while every thread is taken waits in cpp-httplib's queue with its bytes
// unread: its clock starts when a thread reads them.
// Idle keep-alive connections hold threads too: cpp-httplib's thread waits on a connection for
// its next request for 5 s after each answer. When a connection has waited unread through two
// scans (every thread is taken), the idle keep-alive connections that have waited longest (a
// second at least) are closed, one per waiting connection, so it is served within ~2 s instead
// of 5 (or never, while clients keep reusing theirs).
// Oversized requests: cpp-httplib 0.11 bounds each header line (8 KiB) but not their number, and
// keeps every header as a map node: 201 MiB of 6-byte header lines grew the server by 3.7 GB
// (~18x). So every 100 ms the bytes each connection has received since its last answer
// (TCP_INFO) are checked against max_request_bytes (the body limit plus room for headers): past
// it the connection gets a 413 and is closed. That bounds a header flood to ~18x the limit per
// connection, not the server's memory.
class RequestDeadline {
 public:
  enum class Close { kNoRequest, kIdle, kTooLarge };  // why a connection was closed
  // on_close runs (on the deadline's thread) for each connection it closes. max_request_bytes 0:
  // unchecked.
  RequestDeadline(int port, std::chrono::seconds limit, int64_t max_request_bytes, bool quiet,
                  std::function<void(Close)> on_close = {});
  ~RequestDeadline();
  void enter(const Peer& p);
  void leave(const Peer& p);
  // At the server's stop, once the listener is closed: shuts every connection of the port that is
  // not being answered. cpp-httplib's thread on an idle keep-alive connection looks at the stop
  // only when its 5 s wait for a next request ends, so a stop waited for every such client
  // (SIGTERM took ~3 s after one request from the openai client) to close its end or time out.
  void close_idle();

 private:
  void loop();
  void scan();
  void check_sizes(const std::map<Peer, int>& live);
  using Clock = std::chrono::steady_clock;
  const int port_;
  const std::chrono::seconds limit_;
  const int64_t max_request_bytes_;
  const bool quiet_;
  const std::function<void(Close)> on_close_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t epoch_ = 0;                       // scans started; a busy mark records the epoch of its enter
  std::map<Peer, uint64_t> busy_;
  std::map<Peer, Clock::time_point> since_;  // not busy since
  std::set<Peer> answered_;                  // not busy, and answered before: idle keep-alive
  std::set<Peer> queued_;                    // unread bytes at the last scan: waiting for a thread
  std::map<Peer, uint64_t> received_base_;   // bytes received before its current request
  std::set<Peer> answered_since_check_;      // answered since the last size check
  std::set<Peer> cut_;                       // closed for their size, until they are gone
  std::thread thread_;
};

}  // namespace dsv4::server
