#include "server/connections.h"

#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <linux/tcp.h>  // struct tcp_info with tcpi_bytes_received (glibc's lacks it)
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

namespace dsv4::server {

namespace {

int port_of(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return -1;
}

// The peer of socket fd if its local port is `port` and it is connected.
bool peer_of(int fd, int port, Peer& out) {
  sockaddr_storage self{}, peer{};
  socklen_t ls = sizeof self, lp = sizeof peer;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&self), &ls) != 0 || port_of(self) != port ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &lp) != 0)
    return false;
  char host[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&peer), lp, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) return false;
  out = {host, port_of(peer)};
  return true;
}

// This process's open descriptors.
std::vector<int> open_fds() {
  std::vector<int> fds;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return fds;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0' && fd != dirfd(dir)) fds.push_back(static_cast<int>(fd));
  }
  closedir(dir);
  return fds;
}

}  // namespace

void for_each_connection(int port, const std::function<void(int, const Peer&)>& fn) {
  Peer p;
  for (const int fd : open_fds())
    if (peer_of(fd, port, p)) fn(fd, p);
}

bool widen_listen_backlog(int port, int backlog) {
  bool done = false;
  for (const int fd : open_fds()) {
    sockaddr_storage self{};
    socklen_t ls = sizeof self;
    int listening = 0;
    socklen_t ll = sizeof listening;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&self), &ls) != 0 || port_of(self) != port ||
        getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ll) != 0 || !listening)
      continue;
    // listen() on a listening socket only sets its backlog (Linux; POSIX leaves it open).
    done = listen(fd, backlog) == 0 || done;
  }
  return done;
}

int connection_fd(int port, const Peer& peer) {
  int found = -1;
  for_each_connection(port, [&](int fd, const Peer& p) {
    if (found < 0 && p == peer) found = fd;
  });
  return found;
}

bool peer_closed(int fd) {
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

RequestDeadline::RequestDeadline(int port, std::chrono::seconds limit, int64_t max_request_bytes, bool quiet,
                                 std::function<void(Close)> on_close)
    : port_(port), limit_(limit), max_request_bytes_(max_request_bytes), quiet_(quiet), on_close_(std::move(on_close)),
      thread_([this] { loop(); }) {}

RequestDeadline::~RequestDeadline() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void RequestDeadline::enter(const Peer& p) {
  std::lock_guard<std::mutex> l(mu_);
  busy_[p] = epoch_;
  answered_.erase(p);
}

void RequestDeadline::leave(const Peer& p) {
  std::lock_guard<std::mutex> l(mu_);
  busy_.erase(p);
  since_[p] = Clock::now();
  answered_.insert(p);
  answered_since_check_.insert(p);
}

void RequestDeadline::close_idle() {
  std::vector<std::pair<int, Peer>> open;
  for_each_connection(port_, [&](int fd, const Peer& p) { open.push_back({fd, p}); });
  // Under mu_: a request whose handler starts meanwhile (enter) waits for this, and finds its
  // connection shut, as at any stop.
  std::lock_guard<std::mutex> l(mu_);
  for (const auto& [fd, p] : open) {
    Peer now_p;
    if (busy_.count(p) || !peer_of(fd, port_, now_p) || !(now_p == p)) continue;
    shutdown(fd, SHUT_RDWR);
  }
}

void RequestDeadline::loop() {
  std::unique_lock<std::mutex> l(mu_);
  // Sizes every 100 ms (a header flood grows the server ~200 MB a second per connection);
  // deadlines and idle connections every second.
  for (int tick = 1; !cv_.wait_for(l, std::chrono::milliseconds(100), [&] { return stop_; }); ++tick) {
    l.unlock();
    if (tick % 10 == 0) {
      scan();
    } else if (max_request_bytes_ > 0) {
      std::map<Peer, int> live;
      for_each_connection(port_, [&](int fd, const Peer& p) { live[p] = fd; });
      check_sizes(live);
    }
    l.lock();
  }
}

void RequestDeadline::check_sizes(const std::map<Peer, int>& live) {
  if (max_request_bytes_ <= 0) return;
  std::vector<std::pair<int, Peer>> over;
  std::vector<uint64_t> got;
  {
    std::lock_guard<std::mutex> l(mu_);
    std::erase_if(received_base_, [&](const auto& b) { return !live.count(b.first); });
    std::erase_if(answered_since_check_, [&](const Peer& p) { return !live.count(p); });
    std::erase_if(cut_, [&](const Peer& p) { return !live.count(p); });
    for (const auto& [p, fd] : live) {
      tcp_info ti{};
      socklen_t len = sizeof ti;
      if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) continue;
      const uint64_t received = ti.tcpi_bytes_received;
      // While an answer runs its request has been read: what came so far is the next one's base.
      if (busy_.count(p)) {
        received_base_[p] = received;
        continue;
      }
      // Answered between two checks (never seen busy): what has been read belongs to earlier
      // requests (a part of the next read in the meantime escapes the count: bounded by 100 ms).
      if (answered_since_check_.erase(p)) {
        int unread = 0;
        if (ioctl(fd, FIONREAD, &unread) != 0) unread = 0;
        received_base_[p] = received - std::min<uint64_t>(received, static_cast<uint64_t>(unread));
        continue;
      }
      const auto it = received_base_.find(p);
      const uint64_t base = it == received_base_.end() ? 0 : it->second;
      if (received - base > static_cast<uint64_t>(max_request_bytes_) && !cut_.count(p)) over.push_back({fd, p}), got.push_back(received - base);
    }
  }
  for (size_t i = 0; i < over.size(); ++i) {
    const auto& [listed, p] = over[i];
    // A descriptor of our own: cpp-httplib's may be closed and its number reused by a new
    // connection while we read from it below; ours stays this connection's.
    const int fd = fcntl(listed, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) continue;
    Peer now_p;
    if (!peer_of(fd, port_, now_p) || !(now_p == p)) {
      close(fd);
      continue;
    }
    const std::string body = "{\"error\":{\"message\":\"the request exceeds the server's limit (" + std::to_string(max_request_bytes_) +
                             " bytes of headers and body)\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":413}}";
    // 413, not 431: the count cannot tell headers from body (cpp-httplib reads and discards an
    // oversized body before it answers 413 itself, and this cut may come first).
    const std::string res = "HTTP/1.1 413 Content Too Large\r\nContent-Type: application/json\r\nConnection: close\r\n"
                            "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (busy_.count(p)) {  // its request was complete after all: it is being answered
        close(fd);
        continue;
      }
      if (on_close_) on_close_(Close::kTooLarge);
      // Logged and counted first: whoever sees the connection end sees both.
      if (!quiet_)
        std::fprintf(stderr, "dsv4 serve: closed the connection from %s:%d: its request passed %lld bytes (limit %lld)\n",
                     p.addr.c_str(), p.port, static_cast<long long>(got[i]), static_cast<long long>(max_request_bytes_));
      // cpp-httplib's thread is blocked reading, not writing: the answer cannot interleave.
      (void)!send(fd, res.data(), res.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      shutdown(fd, SHUT_RDWR);
      received_base_.erase(p);
      cut_.insert(p);  // closed once: cpp-httplib's thread may still be reading what is queued
    }
    // Linux keeps what was queued (and what still comes) readable after a shutdown: cpp-httplib's
    // thread would go on parsing megabytes of header lines before it sees the end. Discarded
    // here (MSG_TRUNC: no copy), at most 64 MiB.
    static thread_local char sink[64 << 10];
    for (int64_t n = 0; n < (int64_t{64} << 20);) {
      const ssize_t k = recv(fd, sink, sizeof sink, MSG_DONTWAIT | MSG_TRUNC);
      if (k <= 0) break;
      n += k;
    }
    close(fd);
  }
}

void RequestDeadline::scan() {
  uint64_t epoch;
  {
    std::lock_guard<std::mutex> l(mu_);
    epoch = ++epoch_;
  }
  std::map<Peer, int> live;
  for_each_connection(port_, [&](int fd, const Peer& p) { live[p] = fd; });
  check_sizes(live);
  const auto now = Clock::now();
  std::vector<std::pair<int, Peer>> late, reclaim;
  {
    std::lock_guard<std::mutex> l(mu_);
    // Connections gone since: forgotten. A mark made after the listing began (a connection too
    // new to be listed) stays.
    std::erase_if(busy_, [&](const auto& b) { return b.second < epoch && !live.count(b.first); });
    std::erase_if(since_, [&](const auto& s) { return !live.count(s.first); });
    std::erase_if(answered_, [&](const Peer& p) { return !live.count(p); });
    std::set<Peer> queued;
    int starved = 0;  // connections waiting unread since the previous scan or longer
    std::vector<std::pair<Clock::time_point, std::pair<int, Peer>>> idle;
    for (const auto& [p, fd] : live) {
      if (busy_.count(p)) continue;
      // Bytes that wait unread: the connection waits for a thread (every one is taken), which
      // does not count. The clock starts when one reads it. (A thread reads a request within
      // milliseconds of its arrival, so unread through two scans means no thread is free.)
      int unread = 0;
      if (ioctl(fd, FIONREAD, &unread) == 0 && unread > 0) {
        since_[p] = now;
        queued.insert(p);
        starved += queued_.count(p) ? 1 : 0;
        continue;
      }
      const auto it = since_.try_emplace(p, now).first;
      if (now - it->second >= limit_) {
        late.push_back({fd, p}), since_.erase(it), answered_.erase(p);
      } else if (answered_.count(p) && now - it->second >= std::chrono::seconds(1)) {
        // Idle for a second at least: a client reusing its connection at once may be sending
        // its next request, read but not yet marked busy.
        idle.push_back({it->second, {fd, p}});
      }
    }
    queued_ = std::move(queued);
    // Threads for the starved: the longest-idle keep-alive connections give theirs up.
    std::sort(idle.begin(), idle.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (int i = 0; i < starved && i < static_cast<int>(idle.size()); ++i) {
      reclaim.push_back(idle[i].second);
      since_.erase(idle[i].second.second), answered_.erase(idle[i].second.second);
    }
  }
  for (const auto& [fd, p] : reclaim) {
    Peer now_p;
    if (!peer_of(fd, port_, now_p) || !(now_p == p)) continue;
    {
      // A request read since the listing is being answered: left alone. (One that arrives
      // between this and the shutdown is lost, as at any keep-alive timeout; clients retry.)
      std::lock_guard<std::mutex> l(mu_);
      if (busy_.count(p)) continue;
      if (on_close_) on_close_(Close::kIdle);  // first: whoever sees the connection end sees it counted and logged
      if (!quiet_)
        std::fprintf(stderr, "dsv4 serve: closed the idle connection from %s:%d: a new connection waits for a thread\n",
                     p.addr.c_str(), p.port);
      shutdown(fd, SHUT_RDWR);
    }
  }
  for (const auto& [fd, p] : late) {
    // The descriptor may have been closed and reused since it was listed: only the same
    // connection is shut (shutdown, not close: the descriptor stays cpp-httplib's, whose blocked
    // read ends and which closes it).
    Peer now_p;
    if (!peer_of(fd, port_, now_p) || !(now_p == p)) continue;
    if (on_close_) on_close_(Close::kNoRequest);  // first: whoever sees the connection end sees it counted and logged
    if (!quiet_)
      std::fprintf(stderr, "dsv4 serve: closed the connection from %s:%d: no complete request within %lld s\n", p.addr.c_str(),
                   p.port, static_cast<long long>(limit_.count()));
    shutdown(fd, SHUT_RDWR);
  }
}

}  // namespace dsv4::server
