// The TCP rendezvous server and clients; contract in tcp_rendezvous.h.
#include "mcpp/comm/tcp/tcp_rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "mcpp/core/error.h"

namespace mcpp::comm {
namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

std::string addr(const TcpEndpoint& e) { return fmt::format("{}:{}", e.host, e.port); }

void send_line(int fd, const std::string& line) {
  const std::string s = line + "\n";
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t w = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // the peer is gone: its side notices
    off += static_cast<size_t>(w);
  }
}

// Reads into `buf` what is available (non-blocking fd); false when the peer closed or failed.
bool read_some(int fd, std::string& buf) {
  char tmp[4096];
  for (;;) {
    const ssize_t r = ::recv(fd, tmp, sizeof tmp, MSG_DONTWAIT);
    if (r > 0) {
      buf.append(tmp, static_cast<size_t>(r));
      continue;
    }
    if (r == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
}

bool take_line(std::string& buf, std::string* line) {
  const size_t nl = buf.find('\n');
  if (nl == std::string::npos) return false;
  *line = buf.substr(0, nl);
  buf.erase(0, nl + 1);
  return true;
}

// One line from a blocking-mode socket within the deadline; "" when the peer closed.
std::string read_line(int fd, std::string& buf, Clock::time_point deadline, const std::string& where,
                      const std::string& waiting_for) {
  std::string line;
  while (!take_line(buf, &line)) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) fail("rendezvous at {}: timed out waiting for {}", where, waiting_for);
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000))) < 0 && errno != EINTR)
      fail("rendezvous at {}: poll: {}", where, std::strerror(errno));
    if (p.revents && !read_some(fd, buf)) {
      if (take_line(buf, &line)) return line;
      fail("rendezvous at {}: the master closed the connection while waiting for {}", where, waiting_for);
    }
  }
  return line;
}

}  // namespace

bool parse_tcp_rendezvous(const std::string& spec, TcpEndpoint* out) {
  if (spec.rfind("tcp://", 0) != 0) return false;
  const std::string rest = spec.substr(6);
  const size_t colon = rest.rfind(':');
  MCPP_CHECK(colon != std::string::npos && colon > 0, "rendezvous '{}': expected tcp://HOST:PORT", spec);
  out->host = rest.substr(0, colon);
  char* end = nullptr;
  const long port = std::strtol(rest.c_str() + colon + 1, &end, 10);
  MCPP_CHECK(*end == '\0' && port > 0 && port < 65536, "rendezvous '{}': bad port", spec);
  out->port = static_cast<int>(port);
  return true;
}

int tcp_connect_retry(const TcpEndpoint& to, double timeout_seconds, const std::string& who) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(to.host.c_str(), std::to_string(to.port).c_str(), &hints, &res);
  if (rc != 0) fail("{}: cannot resolve the master address '{}' ({})", who, to.host, ::gai_strerror(rc));
  const sockaddr_in sa = *reinterpret_cast<const sockaddr_in*>(res->ai_addr);
  ::freeaddrinfo(res);
  const auto deadline = after(timeout_seconds);
  for (;;) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) fail("{}: socket: {}", who, std::strerror(errno));
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0) return fd;
    const int err = errno;
    ::close(fd);
    if (Clock::now() > deadline)
      fail("{}: cannot reach the master at {} within {} s ({})", who, addr(to), timeout_seconds, std::strerror(err));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::vector<TcpEndpoint> tcp_rendezvous_ranks(const TcpEndpoint& master, int rank, int world, int listen_port,
                                              double timeout_seconds) {
  const std::string where = addr(master);
  const int fd = tcp_connect_retry(master, timeout_seconds, fmt::format("rank {} rendezvous", rank));
  sockaddr_in me{};
  socklen_t len = sizeof me;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len);
  char ip[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &me.sin_addr, ip, sizeof ip);
  send_line(fd, fmt::format("R {} {} {} {}", rank, world, ip, listen_port));
  std::string buf;
  const std::string line = read_line(fd, buf, after(timeout_seconds), where,
                                     fmt::format("all {} ranks", world));
  ::close(fd);
  if (line.rfind("ERR ", 0) == 0) fail("rendezvous at {}: {}", where, line.substr(4));
  std::istringstream in(line);
  std::string tag;
  in >> tag;
  MCPP_CHECK(tag == "T", "rendezvous at {}: unexpected answer '{}'", where, line);
  std::vector<TcpEndpoint> out;
  for (std::string e; in >> e;) {
    const size_t c = e.rfind(':');
    MCPP_CHECK(c != std::string::npos, "rendezvous at {}: bad endpoint '{}'", where, e);
    out.push_back({e.substr(0, c), std::atoi(e.c_str() + c + 1)});
  }
  MCPP_CHECK(static_cast<int>(out.size()) == world, "rendezvous at {}: {} endpoints for {} ranks", where, out.size(),
             world);
  return out;
}

RendezvousServer::RendezvousServer(int port, int world, int nnodes, int nproc)
    : world_(world), nnodes_(nnodes), nproc_(nproc), rank_addr_(static_cast<size_t>(world)),
      node_seen_(static_cast<size_t>(nnodes)), node_done_(static_cast<size_t>(nnodes)) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  if (listen_fd_ < 0) fail("mcpp launch: socket: {}", std::strerror(errno));
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    const int err = errno;
    ::close(listen_fd_);
    fail("master_port: node 0 cannot listen on port {} ({})", port, std::strerror(err));
  }
  ::listen(listen_fd_, 256);
  ::fcntl(listen_fd_, F_SETFL, ::fcntl(listen_fd_, F_GETFL) | O_NONBLOCK);
}

RendezvousServer::~RendezvousServer() {
  for (Conn& c : conns_) ::close(c.fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void RendezvousServer::drop(size_t i) {
  Conn& c = conns_[i];
  if (c.node > 0 && !c.exited && !node_done_[static_cast<size_t>(c.node)]) {  // a node lost before its exit
    exits_[c.node] = -1;
    node_done_[static_cast<size_t>(c.node)] = true;
  }
  ::close(c.fd);
  conns_.erase(conns_.begin() + static_cast<std::ptrdiff_t>(i));
}

void RendezvousServer::handle_line(Conn& c, const std::string& line) {
  std::istringstream in(line);
  std::string tag;
  in >> tag;
  if (tag == "R") {
    int rank = -1, world = -1, port = 0;
    std::string ip;
    in >> rank >> world >> ip >> port;
    if (world != world_ || rank < 0 || rank >= world_ || !rank_addr_[static_cast<size_t>(rank)].empty()) {
      send_line(c.fd, fmt::format("ERR rank {} of world {} does not fit this job (world {}{})", rank, world, world_,
                                  rank >= 0 && rank < world_ ? ", or it registered twice" : ""));
      return;
    }
    c.rank = rank;
    rank_addr_[static_cast<size_t>(rank)] = fmt::format("{}:{}", ip, port);
    ++registered_;  // (poll answers once all are in: answer_ranks closes connections)
  } else if (tag == "L") {
    int node = -1, nnodes = -1, nproc = -1;
    in >> node >> nnodes >> nproc;
    if (nnodes != nnodes_ || nproc != nproc_) {
      send_line(c.fd, fmt::format("ERR node {} was started with --nnodes {} --nproc-per-node {}, the master with "
                                  "--nnodes {} --nproc-per-node {}", node, nnodes, nproc, nnodes_, nproc_));
    } else if (node < 1 || node >= nnodes_ || node_seen_[static_cast<size_t>(node)]) {
      send_line(c.fd, fmt::format("ERR node rank {} is taken or out of range [1, {})", node, nnodes_));
    } else {
      c.node = node;
      node_seen_[static_cast<size_t>(node)] = true;
      send_line(c.fd, "OK");
    }
  } else if (tag == "EXIT" && c.node > 0) {
    int code = -1;
    in >> code;
    c.exited = true;
    node_done_[static_cast<size_t>(c.node)] = true;
    exits_[c.node] = code;
  }
}

void RendezvousServer::answer_ranks() {
  std::string table = "T";
  for (const std::string& a : rank_addr_) table += " " + a;
  for (size_t i = conns_.size(); i-- > 0;)
    if (conns_[i].rank >= 0) {
      send_line(conns_[i].fd, table);
      ::close(conns_[i].fd);
      conns_.erase(conns_.begin() + static_cast<std::ptrdiff_t>(i));
    }
}

void RendezvousServer::poll(int timeout_ms) {
  std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
  for (const Conn& c : conns_) fds.push_back({c.fd, POLLIN, 0});
  if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) return;
  for (size_t i = conns_.size(); i-- > 0;) {  // (back to front: drop() erases)
    if (!fds[i + 1].revents) continue;
    Conn& c = conns_[i];
    const bool open = read_some(c.fd, c.in);
    std::string line;
    while (take_line(c.in, &line)) handle_line(conns_[i], line);
    if (!open) drop(i);
  }
  if (registered_ == world_ && !answered_) {
    answer_ranks();
    answered_ = true;
  }
  if (fds[0].revents & POLLIN)
    for (;;) {
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) break;
      conns_.push_back({.fd = fd, .in = {}});
    }
}

std::map<int, int> RendezvousServer::take_exits() { return std::exchange(exits_, {}); }

int RendezvousServer::nodes_pending() const {
  int n = 0;
  for (int node = 1; node < nnodes_; ++node) n += !node_done_[static_cast<size_t>(node)];
  return n;
}

void RendezvousServer::abort(int node, int code) {
  for (const Conn& c : conns_)
    if (c.node > 0) send_line(c.fd, fmt::format("ABORT {} {}", node, code));
}

RendezvousControl::RendezvousControl(const TcpEndpoint& master, int node_rank, int nnodes, int nproc,
                                     double timeout_seconds)
    : where_(addr(master)) {
  fd_ = tcp_connect_retry(master, timeout_seconds, fmt::format("mcpp launch (node {})", node_rank));
  send_line(fd_, fmt::format("L {} {} {}", node_rank, nnodes, nproc));
  const std::string line = read_line(fd_, in_, after(timeout_seconds), where_,
                                     "the master's answer");
  if (line.rfind("ERR ", 0) == 0) fail("mcpp launch: the master at {} refused this node: {}", where_, line.substr(4));
  MCPP_CHECK(line == "OK", "mcpp launch: unexpected answer '{}' from the master at {}", line, where_);
}

RendezvousControl::~RendezvousControl() {
  if (fd_ >= 0) ::close(fd_);
}

bool RendezvousControl::aborted(std::string* why) {
  const bool open = read_some(fd_, in_);
  std::string line;
  while (take_line(in_, &line))
    if (line.rfind("ABORT ", 0) == 0) {
      int node = -1, code = -1;
      std::istringstream(line.substr(6)) >> node >> code;
      *why = fmt::format("node {} failed (exit {})", node, code);
      return true;
    }
  if (!open) {
    *why = fmt::format("lost the master at {} (node 0 ended)", where_);
    return true;
  }
  return false;
}

void RendezvousControl::report_exit(int code) { send_line(fd_, fmt::format("EXIT {}", code)); }

}  // namespace mcpp::comm
