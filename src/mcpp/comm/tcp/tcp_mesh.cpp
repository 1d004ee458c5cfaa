// TcpMesh: rendezvous through a directory (one node, loopback) or a TCP master (tcp://HOST:PORT, tcp_rendezvous.h:
// many nodes), full-mesh TCP, framed non-blocking exchange.
#include "mcpp/comm/tcp/tcp_mesh.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "mcpp/comm/tcp/tcp_rendezvous.h"
#include "mcpp/core/error.h"

namespace mcpp::comm {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

[[noreturn]] void sys_fail(const std::string& what) { fail("mcpp launch rendezvous: {}: {}", what, std::strerror(errno)); }

void write_all_blocking(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) sys_fail("handshake write");
    c += w;
    n -= static_cast<size_t>(w);
  }
}

void read_all_blocking(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) sys_fail("handshake read");
    c += r;
    n -= static_cast<size_t>(r);
  }
}

int connect_to(const std::string& ip, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) fail("mcpp launch rendezvous: bad peer address '{}'", ip);
  for (int attempt = 0;; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) sys_fail("socket");
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
    ::close(fd);
    if (attempt >= 200) sys_fail(fmt::format("connect to {}:{}", ip, port));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Every rank's published loopback port in the rendezvous directory (waits until all are there).
std::vector<int> ports_from_directory(const std::string& dir, int rank, int size, int port, double timeout_seconds) {
  const fs::path base(dir);
  {
    const fs::path tmp = base / fmt::format(".rank_{}.tmp", rank);
    std::ofstream(tmp) << port << "\n";
    fs::rename(tmp, base / fmt::format("rank_{}", rank));
  }
  std::vector<int> ports(static_cast<size_t>(size), -1);
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_seconds);
  for (;;) {
    std::vector<int> missing;
    for (int r = 0; r < size; ++r) {
      if (ports[static_cast<size_t>(r)] >= 0) continue;
      std::ifstream in(base / fmt::format("rank_{}", r));
      int p = -1;
      if (in >> p) ports[static_cast<size_t>(r)] = p;
      else missing.push_back(r);
    }
    if (missing.empty()) return ports;
    if (Clock::now() > deadline)
      fail("mcpp launch rendezvous in '{}': ranks {} did not start within {} s", dir, fmt::join(missing, ", "),
           timeout_seconds);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

TcpMesh::TcpMesh(const std::string& dir, int rank, int size, double timeout_seconds)
    : rank_(rank), size_(size), peers_(static_cast<size_t>(size)) {
  MCPP_CHECK(size >= 1 && rank >= 0 && rank < size, "mcpp launch: rank {} out of range for world size {}", rank, size);
  if (size == 1) return;
  // 1. Listen on an ephemeral port (loopback for a directory rendezvous, every interface for a TCP one);
  // 2. publish it and learn every rank's endpoint.
  TcpEndpoint master;
  const bool tcp = parse_tcp_rendezvous(dir, &master);
  const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (lfd < 0) sys_fail("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(tcp ? INADDR_ANY : INADDR_LOOPBACK);
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) sys_fail("bind");
  if (::listen(lfd, size) != 0) sys_fail("listen");
  socklen_t len = sizeof a;
  if (::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len) != 0) sys_fail("getsockname");
  const int port = ntohs(a.sin_port);
  std::vector<TcpEndpoint> peers;
  if (tcp) {
    peers = tcp_rendezvous_ranks(master, rank, size, port, timeout_seconds);
  } else {
    for (int p : ports_from_directory(dir, rank, size, port, timeout_seconds)) peers.push_back({"127.0.0.1", p});
  }
  // 3. Full mesh: connect to every lower rank (announcing ours), accept every higher one.
  for (int r = 0; r < rank; ++r) {
    const int fd = connect_to(peers[static_cast<size_t>(r)].host, peers[static_cast<size_t>(r)].port);
    const int32_t me = rank;
    write_all_blocking(fd, &me, sizeof me);
    peers_[static_cast<size_t>(r)].fd = fd;
  }
  for (int i = rank + 1; i < size; ++i) {
    const int fd = ::accept(lfd, nullptr, nullptr);
    if (fd < 0) sys_fail("accept");
    int32_t who = -1;
    read_all_blocking(fd, &who, sizeof who);
    MCPP_CHECK(who > rank && who < size && peers_[static_cast<size_t>(who)].fd < 0,
               "mcpp launch rendezvous: unexpected peer rank {} connecting to rank {}", who, rank);
    peers_[static_cast<size_t>(who)].fd = fd;
  }
  ::close(lfd);
  for (Peer& p : peers_) {
    if (p.fd < 0) continue;
    const int one = 1;
    ::setsockopt(p.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ::fcntl(p.fd, F_SETFL, ::fcntl(p.fd, F_GETFL) | O_NONBLOCK);
  }
}

TcpMesh::~TcpMesh() {
  for (Peer& p : peers_)
    if (p.fd >= 0) ::close(p.fd);
}

void TcpMesh::write_to(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  while (!p.out.empty()) {
    const std::vector<char>& m = p.out.front();
    const ssize_t w = ::send(p.fd, m.data() + p.out_offset, m.size() - p.out_offset, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      fail("tcp communicator: sending to rank {} failed: {} (the peer process probably exited)", peer,
           std::strerror(errno));
    }
    p.out_offset += static_cast<size_t>(w);
    if (p.out_offset == m.size()) {
      p.out.pop_front();
      p.out_offset = 0;
    }
  }
}

void TcpMesh::read_from(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  for (;;) {
    char* dst;
    size_t want;
    if (p.header_got < sizeof p.header) {
      dst = p.header + p.header_got;
      want = sizeof p.header - p.header_got;
    } else {
      dst = p.payload.data() + p.payload_got;
      want = p.payload.size() - p.payload_got;
    }
    ssize_t r = want > 0 ? ::recv(p.fd, dst, want, 0) : 0;
    if (want > 0 && r == 0) {  // an error only if this rank still needs the peer (exchange checks)
      p.closed = true;
      return;
    }
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      fail("tcp communicator: receiving from rank {} failed: {}", peer, std::strerror(errno));
    }
    if (p.header_got < sizeof p.header) {
      p.header_got += static_cast<size_t>(r);
      if (p.header_got < sizeof p.header) continue;
      uint64_t n = 0;
      std::memcpy(&n, p.header + 8, 8);
      p.payload.assign(n, 0);
      p.payload_got = 0;
    } else {
      p.payload_got += static_cast<size_t>(r);
    }
    if (p.header_got == sizeof p.header && p.payload_got == p.payload.size()) {
      uint64_t ch = 0;
      std::memcpy(&ch, p.header, 8);
      p.inbox[ch].push_back(std::move(p.payload));
      p.payload = {};
      p.header_got = 0;
      p.payload_got = 0;
    }
  }
}

void TcpMesh::progress_once(int timeout_ms) {
  std::vector<pollfd> fds;
  std::vector<int> who;
  for (int r = 0; r < size_; ++r) {
    const Peer& p = peers_[static_cast<size_t>(r)];
    if (p.fd < 0 || p.closed) continue;
    fds.push_back({p.fd, static_cast<short>(POLLIN | (p.out.empty() ? 0 : POLLOUT)), 0});
    who.push_back(r);
  }
  if (fds.empty()) return;
  const int n = ::poll(fds.data(), fds.size(), timeout_ms);
  if (n < 0 && errno != EINTR) fail("tcp communicator: poll failed: {}", std::strerror(errno));
  for (size_t i = 0; n > 0 && i < fds.size(); ++i) {
    if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_from(who[i]);
    if (fds[i].revents & POLLOUT) write_to(who[i]);
  }
}

void TcpMesh::exchange(const std::vector<Send>& sends, const std::vector<Recv>& recvs) {
  for (const Send& s : sends) {
    MCPP_CHECK(s.peer != rank_ && s.peer >= 0 && s.peer < size_, "tcp communicator: bad peer {}", s.peer);
    std::vector<char> m(16 + s.nbytes);
    const uint64_t n = s.nbytes;
    std::memcpy(m.data(), &s.channel, 8);
    std::memcpy(m.data() + 8, &n, 8);
    if (s.nbytes) std::memcpy(m.data() + 16, s.data, s.nbytes);
    peers_[static_cast<size_t>(s.peer)].out.push_back(std::move(m));
    write_to(s.peer);  // start right away; what does not fit goes out in progress_once
  }
  std::vector<bool> got(recvs.size(), false);
  size_t remaining = recvs.size();
  for (;;) {
    for (size_t i = 0; i < recvs.size(); ++i) {
      if (got[i]) continue;
      auto& q = peers_[static_cast<size_t>(recvs[i].peer)].inbox[recvs[i].channel];
      if (q.empty()) continue;
      *recvs[i].out = std::move(q.front());
      q.pop_front();
      got[i] = true;
      --remaining;
    }
    bool sending = false;
    for (const Send& s : sends) {
      const Peer& p = peers_[static_cast<size_t>(s.peer)];
      if (p.out.empty()) continue;
      if (p.closed) fail("tcp communicator: rank {} exited before this rank's message to it was delivered", s.peer);
      sending = true;
    }
    if (remaining == 0 && !sending) return;
    for (size_t i = 0; i < recvs.size(); ++i)
      if (!got[i] && peers_[static_cast<size_t>(recvs[i].peer)].closed &&
          peers_[static_cast<size_t>(recvs[i].peer)].inbox[recvs[i].channel].empty())
        fail("tcp communicator: rank {} exited while this rank waits for its message (see that rank's error)",
             recvs[i].peer);
    progress_once(100);
  }
}

}  // namespace mcpp::comm
