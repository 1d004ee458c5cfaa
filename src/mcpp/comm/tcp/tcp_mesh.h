// TcpMesh: the sockets of a TcpCommunicator world (tcp_communicator.h): one connected, non-blocking
// socket per peer, framed messages {channel, nbytes, payload}, per-(peer, channel) inboxes, and
// exchange(), which progresses a set of sends and receives together over poll().
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

namespace mcpp::comm {

class TcpMesh {
 public:
  // Rendezvous in `dir` (a directory on one node, or tcp://HOST:PORT: tcp_rendezvous.h) and connect the full mesh
  // (see tcp_communicator.h). Throws mcpp::Error.
  TcpMesh(const std::string& dir, int rank, int size, double timeout_seconds);
  ~TcpMesh();
  TcpMesh(const TcpMesh&) = delete;
  TcpMesh& operator=(const TcpMesh&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  struct Send {
    int peer;
    uint64_t channel;
    const void* data;
    size_t nbytes;
  };
  struct Recv {
    int peer;
    uint64_t channel;
    std::vector<char>* out;  // filled with the message (any size; the caller checks it)
  };
  // Posts the sends, then progresses until every send is written and every receive has its message.
  void exchange(const std::vector<Send>& sends, const std::vector<Recv>& recvs);

 private:
  struct Peer {
    int fd = -1;
    bool closed = false;  // the peer closed its end (its process finished or died)
    std::deque<std::vector<char>> out;  // framed messages waiting to be written (front partially)
    size_t out_offset = 0;
    char header[16];
    size_t header_got = 0;
    std::vector<char> payload;
    size_t payload_got = 0;
    std::map<uint64_t, std::deque<std::vector<char>>> inbox;
  };
  void progress_once(int timeout_ms);
  void read_from(int peer);
  void write_to(int peer);
  int rank_;
  int size_;
  std::vector<Peer> peers_;
};

}  // namespace mcpp::comm
