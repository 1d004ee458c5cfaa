// The TCP rendezvous of a multi-node TCP world (no shared directory; torchrun's MASTER_ADDR:MASTER_PORT): one
// server (node 0's `mcpp launch`) and its clients, over a line protocol on one port.
//   Ranks (TcpMesh, rendezvous "tcp://HOST:PORT"): connect, send "R <rank> <world> <ip> <port>" (ip: this host's
//     address toward the master, the connection's local end; port: the rank's mesh listener), and read back one
//     line "T <ip>:<port> ..." for ranks 0..world-1 once every rank has registered (tcp_rendezvous_ranks).
//   Launchers of nodes 1..N-1 (`mcpp launch`): "L <node_rank> <nnodes> <nproc>" -> "OK" (or "ERR <why>": a node
//     rank taken twice, another layout); later "EXIT <code>" when their ranks have ended. The server reports each
//     launcher's exit, or the loss of its connection before it (a node that died), to the master launcher, which
//     answers a failure anywhere with "ABORT <node> <code>" to every launcher still connected (RendezvousServer::
//     abort): a rank failure on one node stops every node.
// Errors (unreachable or unresolvable master, timeouts, protocol violations) are mcpp::Error naming HOST:PORT.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mcpp::comm {

struct TcpEndpoint {
  std::string host;
  int port = 0;
};
// "tcp://HOST:PORT" -> {HOST, PORT}; anything else (a directory) -> false.
bool parse_tcp_rendezvous(const std::string& spec, TcpEndpoint* out);

// A connected blocking socket to host:port, retried (connection refused / unreachable) until timeout_seconds;
// an mcpp::Error naming the address and the last error after that (`who`: the message's subject).
int tcp_connect_retry(const TcpEndpoint& to, double timeout_seconds, const std::string& who);

// A rank's side: registers (rank, world, the address its mesh listens on: this host's address toward the master,
// listen_port) and returns every rank's endpoint, index = rank.
std::vector<TcpEndpoint> tcp_rendezvous_ranks(const TcpEndpoint& master, int rank, int world, int listen_port,
                                              double timeout_seconds);

// The server: binds 0.0.0.0:port (an mcpp::Error naming the port when it cannot) and serves the rank registrations
// of a world of `world` ranks and the launchers of nodes 1..nnodes-1 (nproc ranks each). Single-threaded: the
// owner calls poll() in its loop.
class RendezvousServer {
 public:
  RendezvousServer(int port, int world, int nnodes, int nproc);
  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  // Accepts, reads and answers for up to timeout_ms.
  void poll(int timeout_ms);
  // Node events since the last call: node -> exit code (a lost connection before EXIT: -1).
  std::map<int, int> take_exits();
  int nodes_pending() const;
  bool ranks_answered() const { return answered_; }  // every rank has been sent the table  // launchers (nodes 1..N-1) that have not yet reported their exit
  // Tells every connected launcher to stop its ranks ("ABORT <node> <code>").
  void abort(int node, int code);

 private:
  struct Conn {
    int fd = -1;
    std::string in;
    int node = -1;  // a launcher's node rank once registered
    int rank = -1;  // a rank's, once registered
    bool exited = false;
  };
  void handle_line(Conn& c, const std::string& line);
  void answer_ranks();
  void drop(size_t i);
  int listen_fd_ = -1;
  int world_, nnodes_, nproc_;
  std::vector<Conn> conns_;
  std::vector<std::string> rank_addr_;  // "ip:port" per rank, "" until registered
  int registered_ = 0;
  bool answered_ = false;
  std::map<int, int> exits_;  // reported since take_exits
  std::vector<bool> node_seen_, node_done_;
};

// A non-master launcher's side: the control connection to the master (registered as node_rank).
class RendezvousControl {
 public:
  RendezvousControl(const TcpEndpoint& master, int node_rank, int nnodes, int nproc, double timeout_seconds);
  ~RendezvousControl();
  RendezvousControl(const RendezvousControl&) = delete;
  RendezvousControl& operator=(const RendezvousControl&) = delete;
  // Non-blocking: true when the master said ABORT or the connection closed (the master's node is gone); *why says
  // which.
  bool aborted(std::string* why);
  void report_exit(int code);

 private:
  int fd_ = -1;
  std::string in_;
  std::string where_;
};

}  // namespace mcpp::comm
