// comm_gloo_transport.h — an authenticating TCP transport under Gloo's algorithms (part of the
// Gloo shim, see comm_gloo.cc). Implements gloo::transport::{Context, Pair, UnboundBuffer} for
// the unbound-buffer algorithms the shim uses (allreduce, allgather, broadcast, barrier) and its
// point-to-point sends; every connection proves the job's key before it carries a byte, and
// every frame on it is authenticated (comm_auth.h). docs/DESIGN.md, "The data plane's
// connections", explains the choices.
//
// One listening socket per communicator (Listener), served by the context's own event loop
// thread, which also runs the handshakes of incoming connections (each bounded in time, a
// bounded number at once, so strangers that knock never block a peer) and all reads. The higher
// rank of a pair dials the lower one (Context::connectAll).
#ifndef DEADPOOL_COMM_GLOO_TRANSPORT_H
#define DEADPOOL_COMM_GLOO_TRANSPORT_H

#include <chrono>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/transport/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/unbound_buffer.h>

#include "comm_auth.h"

namespace dpauth {

// Errors by type, never by their text: a wait or a connection that ran out of its time throws
// Timeout (COMM_ERR_TIMEOUT); every other gloo::IoException of this transport is a peer's
// failure (closed, reset, a bad tag, aborted: COMM_ERR_PEER).
struct Timeout : public gloo::IoException {
    explicit Timeout(const std::string &msg) : gloo::IoException(msg) {}
};

class Context;
class Pair;
class UnboundBuffer;

// A bound, listening TCP socket on host, port chosen by the kernel; its address is what the
// rendezvous publishes. Handed to the Context, which accepts on it.
class Listener {
  public:
    explicit Listener(const std::string &host);
    ~Listener();
    Listener(const Listener &) = delete;
    Listener &operator=(const Listener &) = delete;
    std::vector<char> addressBytes() const { return address_.bytes(); }
    std::string str() const { return address_.str(); }
    int release(); // hands the descriptor over (-1 afterwards)

  private:
    int fd_ = -1;
    gloo::transport::tcp::Address address_;
};

struct Handler {
    virtual void handleEvents(uint32_t events) = 0;
    virtual ~Handler() = default;
};

class UnboundBuffer : public gloo::transport::UnboundBuffer {
  public:
    UnboundBuffer(const std::shared_ptr<Context> &ctx, void *ptr, size_t size);
    ~UnboundBuffer() override;

    bool waitRecv(int *rank, std::chrono::milliseconds timeout) override;
    bool waitSend(int *rank, std::chrono::milliseconds timeout) override;
    void abortWaitRecv() override;
    void abortWaitSend() override;
    void send(int dstRank, uint64_t slot, size_t offset, size_t nbytes) override;
    void recv(int srcRank, uint64_t slot, size_t offset, size_t nbytes) override;
    void recv(std::vector<int> srcRanks, uint64_t slot, size_t offset, size_t nbytes) override;

  private:
    friend class Pair;
    void handleRecvCompletion(int rank);
    void handleSendCompletion(int rank);
    void signalException(std::exception_ptr ex);
    bool wait(bool recv, int *rank, std::chrono::milliseconds timeout);

    std::shared_ptr<Context> ctx_;
    std::mutex m_;
    std::condition_variable recvCv_, sendCv_;
    int recvCompletions_ = 0, sendCompletions_ = 0, recvRank_ = -1, sendRank_ = -1;
    bool abortRecv_ = false, abortSend_ = false;
    std::exception_ptr ex_;
    std::vector<int> touched_; // the ranks of the pairs it has operations posted on (owner thread)
};

class Pair : public gloo::transport::Pair, public Handler {
  public:
    Pair(Context *ctx, int rank);
    ~Pair() override;

    const gloo::transport::Address &address() const override;
    void connect(const std::vector<char> &bytes) override;
    void close() override;
    void setSync(bool enable, bool busyPoll) override;
    std::unique_ptr<gloo::transport::Buffer> createSendBuffer(int slot, void *ptr, size_t size) override;
    std::unique_ptr<gloo::transport::Buffer> createRecvBuffer(int slot, void *ptr, size_t size) override;
    void send(gloo::transport::UnboundBuffer *buf, uint64_t slot, size_t offset, size_t nbytes) override;
    void recv(gloo::transport::UnboundBuffer *buf, uint64_t slot, size_t offset, size_t nbytes) override;
    void handleEvents(uint32_t events) override;

    // The connection, authenticated (fd non-blocking), dialed by us or accepted (counted in the
    // context): false when the pair already has one.
    bool attach(int fd, const comm_session &s, bool dialed);
    bool connected(); // rethrows the pair's failure; takes no lock
    int dupSocket(); // a duplicate of the connection's descriptor, -1 if none
    void signalExceptionExternal(const std::string &msg);
    void forget(UnboundBuffer *buf); // the buffer goes away: no operation may refer to it any more

  private:
    struct Pending {
        UnboundBuffer *buf;
        size_t offset, nbytes;
    };
    struct TxOp {
        comm_frame f{};
        UnboundBuffer *buf = nullptr; // DATA only
        size_t offset = 0;
        bool sealed = false, tagged = false;
        size_t total = 0, done = 0, macd = 0;
        unsigned char head[COMM_FRAME_HEAD_BYTES];
        unsigned char tag[COMM_FRAME_TAG_BYTES];
        crypto_onetimeauth_state mac;
    };
    struct Rx {
        int phase = 0; // 0: header, 1: payload and its tag
        size_t got = 0;
        unsigned char head[COMM_FRAME_HEAD_BYTES];
        comm_frame f{};
        UnboundBuffer *buf = nullptr;
        size_t offset = 0, pgot = 0, tgot = 0;
        unsigned char tag[COMM_FRAME_TAG_BYTES];
        crypto_onetimeauth_state mac;
    };

    void throwIfException();
    void signalException(const std::string &msg);
    void queue(TxOp op);
    void queueData(const Pending &p, uint64_t slot);
    bool flush();
    void wantWrite(bool on);
    void readable();
    bool headArrived();          // a frame's head is complete: false when the connection failed
    bool bodyArrived(size_t got); // got bytes of a DATA frame's payload and tag: false when it failed
    void closeSocket();
    std::string peerName() const;

    Context *const ctx_;
    const int rank_;
    std::mutex m_;
    int fd_ = -1;
    bool closed_ = false, writeArmed_ = false;
    std::exception_ptr ex_; // set once, under m_, before state_ says so
    std::atomic<int> state_{0}; // 0 connecting, 1 connected, 2 failed
    comm_session session_{};
    size_t sendBufferSize_ = 0;
    std::deque<TxOp> tx_;
    Rx rx_;
    std::unordered_map<uint64_t, std::deque<Pending>> pendingSend_, pendingRecv_;
    std::unordered_map<uint64_t, std::deque<uint64_t>> remoteRecv_; // the peer's posted receives' sizes
};

class Context : public gloo::transport::Context, public std::enable_shared_from_this<Context> {
  public:
    // key: the job's data-plane key; prefix: the communicator's store prefix (bound into every
    // handshake). Takes the listener's socket and starts the event loop.
    Context(Listener &listener, int rank, int size, const unsigned char key[COMM_KEY_BYTES], const std::string &prefix,
            std::chrono::milliseconds timeout);
    ~Context() override;

    std::unique_ptr<gloo::transport::Pair> &createPair(int rank) override;
    std::unique_ptr<gloo::transport::UnboundBuffer> createUnboundBuffer(void *ptr, size_t size) override;

    // Dials every lower rank at theirs[r] (retrying a handshake that a stranger's crowding or a
    // squatter spoiled, until the deadline), then waits until every higher rank has connected.
    void connectAll(const std::vector<std::vector<char>> &theirs);
    std::vector<int> dupSockets();
    // Pair connections this context made: dialed (and proven) to a peer, accepted from one.
    int dialed() const { return dialed_.load(); }
    int accepted() const { return accepted_.load(); }
    void signalException(const std::string &msg);
    const gloo::transport::Address &address() const { return address_; }

    // How long an incoming connection may take to prove the key, and how many may be trying
    // at once besides twice the peers expected to dial (the oldest is dropped for a newer one).
    static constexpr std::chrono::milliseconds kHandshakeBound{3000};
    static constexpr size_t kMaxHandshaking = 64;

  private:
    friend class Pair;
    friend class UnboundBuffer;
    struct Incoming;
    struct ListenHandler : Handler {
        Context *ctx = nullptr;
        void handleEvents(uint32_t) override;
    };
    void loop();
    void acceptAll();
    void incomingReadable(Incoming *in);
    void dropIncoming(Incoming *in);
    void dial(int peer, const std::vector<char> &bytes, std::chrono::steady_clock::time_point deadline);
    Pair *pair(int r) { return static_cast<Pair *>(pairs_[r].get()); }
    void pairConnected();

    int listenFd_ = -1, epollFd_ = -1, wakeFd_ = -1;
    gloo::transport::tcp::Address address_;
    unsigned char key_[COMM_KEY_BYTES];
    std::string prefix_;
    ListenHandler listenHandler_;
    std::thread loop_;
    std::list<std::unique_ptr<Incoming>> incoming_; // loop thread only, in arrival order
    std::list<std::unique_ptr<Incoming>> dropped_;  // freed after the events in hand
    int expectIncoming_ = 0, gotIncoming_ = 0;      // loop thread only
    std::mutex connMutex_;
    std::condition_variable connCv_;
    int connected_ = 0;
    std::atomic<int> dialed_{0}, accepted_{0};
};

} // namespace dpauth

#endif
