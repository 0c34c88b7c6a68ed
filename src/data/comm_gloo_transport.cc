// comm_gloo_transport.cc — the authenticating transport under Gloo's algorithms
// (comm_gloo_transport.h; wire format in comm_auth.h).
//
// Matching (what Gloo's tcp transport does, less recv-from-any, which the shim never uses): a
// receive posted on a pair sends RECV_READY(slot, nbytes) to the peer; a send goes out as one
// DATA frame once the peer's RECV_READY for its slot has come, straight from the caller's
// buffer into the socket, and lands straight in the receiver's buffer: no copies. The payload's
// Poly1305 tag is computed kMacAhead bytes ahead of what is written (still in cache when the
// kernel copies it) and checked over what each read brought in. The loop thread does every read
// and the writes that the caller's non-blocking attempt left over (EPOLLOUT).
//
// Locks: Pair::m_, then UnboundBuffer::m_ (completions and failures are delivered under the
// pair's lock); Pair::m_, then Context::connMutex_. No lock is held across a blocking call.
#include "comm_gloo_transport.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <gloo/common/error.h>

namespace dpauth {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kMacAhead = 256 * 1024;          // payload MAC'd ahead of the socket writes
constexpr size_t kReadBurst = 8 * 1024 * 1024;    // bytes one readable event takes before yielding
constexpr size_t kMaxSendBufferSize = 32u << 20;  // as Gloo's tcp pair grows SO_SNDBUF

[[noreturn]] void ioError(const std::string &msg) { throw gloo::IoException(msg); }

std::string errnoStr(int e) { return std::string(strerror(e)); }

void setNoDelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int msLeft(Clock::time_point deadline) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

// Reads or writes exactly n bytes on a blocking-mode socket before the deadline. "" or why not.
std::string ioFull(int fd, unsigned char *p, size_t n, bool write, Clock::time_point deadline) {
    size_t done = 0;
    while (done < n) {
        struct pollfd pfd = {fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
        int left = msLeft(deadline);
        if (left == 0) return "timed out";
        int r = poll(&pfd, 1, left);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return "poll: " + errnoStr(errno);
        if (r == 0) return "timed out";
        ssize_t rv = write ? ::send(fd, p + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT)
                           : ::recv(fd, p + done, n - done, MSG_DONTWAIT);
        if (rv < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (rv < 0) return errnoStr(errno);
        if (rv == 0) return "connection closed by peer";
        done += static_cast<size_t>(rv);
    }
    return "";
}

} // namespace

// ---- Listener ----------------------------------------------------------------------------

Listener::Listener(const std::string &host) {
    struct addrinfo hints = {}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_PASSIVE;
    int rv = getaddrinfo(host.c_str(), "0", &hints, &res);
    if (rv != 0 || res == nullptr) {
        // Not a numeric address: a host name.
        hints.ai_flags = AI_PASSIVE;
        rv = getaddrinfo(host.c_str(), "0", &hints, &res);
        if (rv != 0 || res == nullptr) ioError("data plane: cannot resolve " + host + ": " + gai_strerror(rv));
    }
    std::string why;
    for (struct addrinfo *a = res; a != nullptr && fd_ < 0; a = a->ai_next) {
        int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            why = errnoStr(errno);
            continue;
        }
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 512) != 0) {
            why = errnoStr(errno);
            ::close(fd);
            continue;
        }
        fd_ = fd;
    }
    freeaddrinfo(res);
    if (fd_ < 0) ioError("data plane: cannot listen on " + host + ": " + why);
    struct sockaddr_storage ss = {};
    socklen_t len = sizeof ss;
    if (getsockname(fd_, reinterpret_cast<struct sockaddr *>(&ss), &len) != 0) {
        int e = errno;
        ::close(fd_);
        fd_ = -1;
        ioError("data plane: getsockname: " + errnoStr(e));
    }
    address_ = gloo::transport::tcp::Address(ss);
}

Listener::~Listener() {
    if (fd_ >= 0) ::close(fd_);
}

int Listener::release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
}

// ---- UnboundBuffer -------------------------------------------------------------------------

UnboundBuffer::UnboundBuffer(const std::shared_ptr<Context> &ctx, void *ptr, size_t size)
    : gloo::transport::UnboundBuffer(ptr, size), ctx_(ctx) {}

UnboundBuffer::~UnboundBuffer() {
    for (int r : touched_) ctx_->pair(r)->forget(this);
}

void UnboundBuffer::handleRecvCompletion(int rank) {
    std::lock_guard<std::mutex> lock(m_);
    recvCompletions_++;
    recvRank_ = rank;
    recvCv_.notify_one();
}

void UnboundBuffer::handleSendCompletion(int rank) {
    std::lock_guard<std::mutex> lock(m_);
    sendCompletions_++;
    sendRank_ = rank;
    sendCv_.notify_one();
}

void UnboundBuffer::signalException(std::exception_ptr ex) {
    std::lock_guard<std::mutex> lock(m_);
    if (ex_ == nullptr) ex_ = std::move(ex);
    recvCv_.notify_all();
    sendCv_.notify_all();
}

void UnboundBuffer::abortWaitRecv() {
    std::lock_guard<std::mutex> lock(m_);
    abortRecv_ = true;
    recvCv_.notify_all();
}

void UnboundBuffer::abortWaitSend() {
    std::lock_guard<std::mutex> lock(m_);
    abortSend_ = true;
    sendCv_.notify_all();
}

// As Gloo's: true when an operation completed, false when the wait was aborted; throws the
// pair's exception, or on timeout fails every pair of the context (so the peers learn at once)
// and throws.
bool UnboundBuffer::wait(bool recv, int *rank, milliseconds timeout) {
    std::unique_lock<std::mutex> lock(m_);
    if (timeout == gloo::transport::kUnsetTimeout) timeout = ctx_->getTimeout();
    int &completions = recv ? recvCompletions_ : sendCompletions_;
    bool &aborted = recv ? abortRecv_ : abortSend_;
    std::condition_variable &cv = recv ? recvCv_ : sendCv_;
    if (completions == 0) {
        bool done = cv.wait_for(lock, timeout, [&] {
            if (ex_ != nullptr) std::rethrow_exception(ex_);
            return aborted || completions > 0;
        });
        if (!done) {
            lock.unlock();
            ctx_->signalException("Application timeout caused pair closure");
            throw Timeout(GLOO_ERROR_MSG("Timed out waiting ", timeout.count(), "ms for ",
                                                   recv ? "recv" : "send", " operation to complete"));
        }
    }
    if (aborted) {
        aborted = false;
        return false;
    }
    completions--;
    if (rank != nullptr) *rank = recv ? recvRank_ : sendRank_;
    return true;
}

bool UnboundBuffer::waitRecv(int *rank, milliseconds timeout) { return wait(true, rank, timeout); }
bool UnboundBuffer::waitSend(int *rank, milliseconds timeout) { return wait(false, rank, timeout); }

void UnboundBuffer::send(int dstRank, uint64_t slot, size_t offset, size_t nbytes) {
    if (nbytes == kUnspecifiedByteCount) {
        if (offset > size) ioError("send: offset past the buffer");
        nbytes = size - offset;
    }
    if (dstRank < 0 || dstRank >= ctx_->size || dstRank == ctx_->rank) ioError("send: no pair for rank " + std::to_string(dstRank));
    if (std::find(touched_.begin(), touched_.end(), dstRank) == touched_.end()) touched_.push_back(dstRank);
    ctx_->pair(dstRank)->send(this, slot, offset, nbytes);
}

void UnboundBuffer::recv(int srcRank, uint64_t slot, size_t offset, size_t nbytes) {
    if (nbytes == kUnspecifiedByteCount) {
        if (offset > size) ioError("recv: offset past the buffer");
        nbytes = size - offset;
    }
    if (srcRank < 0 || srcRank >= ctx_->size || srcRank == ctx_->rank) ioError("recv: no pair for rank " + std::to_string(srcRank));
    if (std::find(touched_.begin(), touched_.end(), srcRank) == touched_.end()) touched_.push_back(srcRank);
    ctx_->pair(srcRank)->recv(this, slot, offset, nbytes);
}

void UnboundBuffer::recv(std::vector<int> srcRanks, uint64_t slot, size_t offset, size_t nbytes) {
    if (srcRanks.size() != 1)
        throw std::runtime_error("the authenticated transport does not support a receive from any of several ranks");
    recv(srcRanks[0], slot, offset, nbytes);
}

// ---- Pair ----------------------------------------------------------------------------------

Pair::Pair(Context *ctx, int rank) : ctx_(ctx), rank_(rank) {}

Pair::~Pair() {
    std::lock_guard<std::mutex> lock(m_);
    closeSocket();
    sodium_memzero(&session_, sizeof session_);
}

const gloo::transport::Address &Pair::address() const { return ctx_->address(); }

std::string Pair::peerName() const { return "rank " + std::to_string(rank_); }

void Pair::connect(const std::vector<char> &bytes) {
    Clock::time_point deadline = Clock::now() + ctx_->getTimeout();
    if (rank_ < ctx_->rank) {
        ctx_->dial(rank_, bytes, deadline);
        return;
    }
    std::unique_lock<std::mutex> lock(ctx_->connMutex_);
    if (!ctx_->connCv_.wait_until(lock, deadline, [&] { return connected(); }))
        throw Timeout("Connect timeout: " + peerName() + " did not connect within " +
                std::to_string(ctx_->getTimeout().count()) + " ms");
}

bool Pair::connected() {
    int st = state_.load(std::memory_order_acquire);
    if (st == 2) std::rethrow_exception(ex_);
    return st == 1;
}

bool Pair::attach(int fd, const comm_session &s, bool dialed) {
    {
        std::lock_guard<std::mutex> lock(m_);
        if (fd_ >= 0 || closed_) return false;
        fd_ = fd;
        session_ = s;
        setNoDelay(fd);
        struct epoll_event ev = {};
        ev.events = EPOLLIN;
        ev.data.ptr = static_cast<Handler *>(this);
        if (epoll_ctl(ctx_->epollFd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
            fd_ = -1;
            return false;
        }
        state_.store(1, std::memory_order_release);
    }
    (dialed ? ctx_->dialed_ : ctx_->accepted_)++; // before connectAll can see the pair connected
    ctx_->pairConnected();
    return true;
}

int Pair::dupSocket() {
    std::lock_guard<std::mutex> lock(m_);
    return fd_ >= 0 ? fcntl(fd_, F_DUPFD_CLOEXEC, 0) : -1;
}

void Pair::closeSocket() {
    if (fd_ < 0) return;
    epoll_ctl(ctx_->epollFd_, EPOLL_CTL_DEL, fd_, nullptr);
    shutdown(fd_, SHUT_RDWR); // reaches the peer even while a duplicate (comm_abort's) is open
    ::close(fd_);
    fd_ = -1;
}

void Pair::throwIfException() {
    if (ex_ != nullptr) std::rethrow_exception(ex_);
}

// Under m_: the first failure fails every operation of this pair and closes the connection.
void Pair::signalException(const std::string &msg) {
    if (ex_ != nullptr) return;
    ex_ = std::make_exception_ptr(gloo::IoException(msg));
    auto fail = [&](UnboundBuffer *b) {
        if (b != nullptr) b->signalException(ex_);
    };
    for (auto &q : pendingSend_)
        for (auto &p : q.second) fail(p.buf);
    for (auto &q : pendingRecv_)
        for (auto &p : q.second) fail(p.buf);
    for (auto &op : tx_) fail(op.buf);
    fail(rx_.buf);
    pendingSend_.clear();
    pendingRecv_.clear();
    remoteRecv_.clear();
    tx_.clear();
    rx_ = Rx();
    closed_ = true;
    closeSocket();
    state_.store(2, std::memory_order_release);
    std::lock_guard<std::mutex> lock(ctx_->connMutex_); // (m_, then connMutex_)
    ctx_->connCv_.notify_all(); // a connect waiting on this pair learns at once
}

void Pair::signalExceptionExternal(const std::string &msg) {
    std::lock_guard<std::mutex> lock(m_);
    signalException(msg);
}

void Pair::close() {
    std::lock_guard<std::mutex> lock(m_);
    signalException("Connection closed by this rank (" + peerName() + ")");
}

void Pair::setSync(bool enable, bool) {
    if (enable) throw std::runtime_error("the authenticated transport has no sync mode");
}

std::unique_ptr<gloo::transport::Buffer> Pair::createSendBuffer(int, void *, size_t) {
    throw std::runtime_error("the authenticated transport supports unbound buffers only");
}

std::unique_ptr<gloo::transport::Buffer> Pair::createRecvBuffer(int, void *, size_t) {
    throw std::runtime_error("the authenticated transport supports unbound buffers only");
}

void Pair::forget(UnboundBuffer *buf) {
    std::lock_guard<std::mutex> lock(m_);
    bool pending = rx_.buf == buf;
    for (auto *m : {&pendingSend_, &pendingRecv_})
        for (auto &q : *m)
            for (auto &p : q.second) pending = pending || p.buf == buf;
    for (auto &op : tx_) pending = pending || op.buf == buf;
    // Only a failed or abandoned operation leaves a buffer with a transfer pending: the pair
    // cannot carry on without it (its bytes are owed or due), so it fails, and so does the peer.
    if (pending) signalException("Connection closed: a buffer was released with a transfer pending (" + peerName() + ")");
}

void Pair::send(gloo::transport::UnboundBuffer *tbuf, uint64_t slot, size_t offset, size_t nbytes) {
    auto *buf = static_cast<UnboundBuffer *>(tbuf);
    if (offset > buf->size || nbytes > buf->size - offset) ioError("send: range past the buffer");
    std::lock_guard<std::mutex> lock(m_);
    throwIfException();
    if (fd_ < 0) ioError("send: " + peerName() + " is not connected");
    Pending p{buf, offset, nbytes};
    auto it = remoteRecv_.find(slot);
    if (it != remoteRecv_.end()) {
        uint64_t room = it->second.front();
        it->second.pop_front();
        if (it->second.empty()) remoteRecv_.erase(it);
        if (nbytes > room) {
            signalException("send of " + std::to_string(nbytes) + " bytes to " + peerName() + " on slot " +
                            std::to_string(slot) + ", which receives " + std::to_string(room));
            throwIfException();
        }
        queueData(p, slot);
    } else {
        pendingSend_[slot].push_back(p);
    }
    throwIfException();
}

void Pair::recv(gloo::transport::UnboundBuffer *tbuf, uint64_t slot, size_t offset, size_t nbytes) {
    auto *buf = static_cast<UnboundBuffer *>(tbuf);
    if (offset > buf->size || nbytes > buf->size - offset) ioError("recv: range past the buffer");
    std::lock_guard<std::mutex> lock(m_);
    throwIfException();
    if (fd_ < 0) ioError("recv: " + peerName() + " is not connected");
    pendingRecv_[slot].push_back(Pending{buf, offset, nbytes});
    TxOp op;
    op.f.type = COMM_FRAME_RECV_READY;
    op.f.slot = slot;
    op.f.nbytes = nbytes;
    queue(std::move(op));
    throwIfException();
}

void Pair::queueData(const Pending &p, uint64_t slot) {
    TxOp op;
    op.f.type = COMM_FRAME_DATA;
    op.f.slot = slot;
    op.f.nbytes = p.nbytes;
    op.buf = p.buf;
    op.offset = p.offset;
    size_t want = std::min(p.nbytes + COMM_FRAME_HEAD_BYTES + COMM_FRAME_TAG_BYTES, kMaxSendBufferSize);
    if (sendBufferSize_ < want) {
        int v = static_cast<int>(want);
        socklen_t len = sizeof v;
        if (setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &v, len) == 0 && getsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &v, &len) == 0)
            sendBufferSize_ = static_cast<size_t>(v);
    }
    queue(std::move(op));
}

void Pair::queue(TxOp op) {
    tx_.push_back(std::move(op));
    if (tx_.size() == 1) flush();
}

void Pair::wantWrite(bool on) {
    if (on == writeArmed_ || fd_ < 0) return;
    struct epoll_event ev = {};
    ev.events = on ? (EPOLLIN | EPOLLOUT) : EPOLLIN;
    ev.data.ptr = static_cast<Handler *>(this);
    if (epoll_ctl(ctx_->epollFd_, EPOLL_CTL_MOD, fd_, &ev) == 0) writeArmed_ = on;
}

// Under m_: writes what the socket takes, in order. false when the pair failed.
bool Pair::flush() {
    while (!tx_.empty() && fd_ >= 0) {
        TxOp &op = tx_.front();
        const bool data = op.f.type == COMM_FRAME_DATA;
        const size_t n = data ? op.f.nbytes : 0;
        const unsigned char *base = data ? static_cast<const unsigned char *>(op.buf->ptr) + op.offset : nullptr;
        if (!op.sealed) {
            comm_frame_seal(&session_, &op.f, op.head, data ? &op.mac : nullptr);
            op.sealed = true;
            op.total = COMM_FRAME_HEAD_BYTES + (data ? n + COMM_FRAME_TAG_BYTES : 0);
        }
        while (op.done < op.total) {
            size_t pw = 0; // payload bytes written
            if (data) {
                pw = op.done > COMM_FRAME_HEAD_BYTES ? std::min(op.done - COMM_FRAME_HEAD_BYTES, n) : 0;
                size_t want = std::min(n, pw + kMacAhead);
                if (op.macd < want) {
                    crypto_onetimeauth_update(&op.mac, base + op.macd, want - op.macd);
                    op.macd = want;
                }
                if (op.macd == n && !op.tagged) {
                    comm_frame_payload_tag(&op.mac, op.tag);
                    op.tagged = true;
                }
            }
            struct iovec iov[3];
            int ioc = 0;
            if (op.done < COMM_FRAME_HEAD_BYTES) iov[ioc++] = {op.head + op.done, COMM_FRAME_HEAD_BYTES - op.done};
            if (data && pw < op.macd) iov[ioc++] = {const_cast<unsigned char *>(base) + pw, op.macd - pw};
            if (data && op.tagged) { // the whole payload is in this write or before it: the tag follows
                size_t tw = op.done > COMM_FRAME_HEAD_BYTES + n ? op.done - COMM_FRAME_HEAD_BYTES - n : 0;
                iov[ioc++] = {op.tag + tw, COMM_FRAME_TAG_BYTES - tw};
            }
            struct msghdr msg = {};
            msg.msg_iov = iov;
            msg.msg_iovlen = static_cast<size_t>(ioc);
            ssize_t rv = sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (rv < 0) {
                if (errno == EINTR) continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK) {
                    wantWrite(true);
                    return true;
                }
                signalException("writev " + peerName() + ": " + errnoStr(errno));
                return false;
            }
            op.done += static_cast<size_t>(rv);
        }
        UnboundBuffer *done = data ? op.buf : nullptr;
        tx_.pop_front();
        if (done != nullptr) done->handleSendCompletion(rank_);
    }
    wantWrite(false);
    return true;
}

void Pair::handleEvents(uint32_t events) {
    std::lock_guard<std::mutex> lock(m_);
    if (fd_ < 0) return;
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) readable();
    if (fd_ >= 0 && (events & EPOLLOUT)) flush();
}

// Under m_, loop thread: reads what has arrived, at most kReadBurst bytes.
void Pair::readable() {
    size_t taken = 0;
    while (fd_ >= 0 && taken < kReadBurst) {
        ssize_t rv;
        if (rx_.phase == 0) {
            rv = ::recv(fd_, rx_.head + rx_.got, COMM_FRAME_HEAD_BYTES - rx_.got, MSG_DONTWAIT);
        } else {
            struct iovec iov[2];
            int ioc = 0;
            size_t n = rx_.f.nbytes;
            if (rx_.pgot < n) iov[ioc++] = {static_cast<unsigned char *>(rx_.buf->ptr) + rx_.offset + rx_.pgot, n - rx_.pgot};
            iov[ioc++] = {rx_.tag + rx_.tgot, COMM_FRAME_TAG_BYTES - rx_.tgot};
            struct msghdr msg = {};
            msg.msg_iov = iov;
            msg.msg_iovlen = static_cast<size_t>(ioc);
            rv = recvmsg(fd_, &msg, MSG_DONTWAIT);
        }
        if (rv < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            signalException("Read error " + peerName() + ": " + errnoStr(errno));
            return;
        }
        if (rv == 0) {
            signalException("Connection closed by peer " + peerName());
            return;
        }
        taken += static_cast<size_t>(rv);
        if (rx_.phase == 0) {
            rx_.got += static_cast<size_t>(rv);
            if (rx_.got == COMM_FRAME_HEAD_BYTES && !headArrived()) return;
            continue;
        }
        if (!bodyArrived(static_cast<size_t>(rv))) return;
    }
}

// Under m_: a frame's head is complete. A RECV_READY is matched with a send waiting for it (or
// kept for the next one); a DATA frame with the receive posted for its slot, which its
// payload then fills.
bool Pair::headArrived() {
    // The largest DATA frame any receive posted here could take: a bound checked again below.
    int r = comm_frame_open(&session_, rx_.head, UINT64_MAX, &rx_.f, &rx_.mac);
    if (r != COMM_FRAME_OK) {
        signalException(std::string("Connection closed: ") + comm_frame_result_str(r) + " from " + peerName());
        return false;
    }
    uint64_t slot = rx_.f.slot, n = rx_.f.nbytes;
    if (rx_.f.type == COMM_FRAME_RECV_READY) {
        rx_ = Rx();
        auto it = pendingSend_.find(slot);
        if (it == pendingSend_.end()) {
            remoteRecv_[slot].push_back(n);
            return true;
        }
        Pending p = it->second.front();
        it->second.pop_front();
        if (it->second.empty()) pendingSend_.erase(it);
        if (p.nbytes > n) {
            signalException("send of " + std::to_string(p.nbytes) + " bytes to " + peerName() + " on slot " +
                            std::to_string(slot) + ", which receives " + std::to_string(n));
            return false;
        }
        queueData(p, slot);
        return true;
    }
    auto it = pendingRecv_.find(slot);
    if (it == pendingRecv_.end()) {
        signalException("Connection closed: " + peerName() + " sent data on slot " + std::to_string(slot) +
                        " that no receive asked for");
        return false;
    }
    Pending p = it->second.front();
    it->second.pop_front();
    if (it->second.empty()) pendingRecv_.erase(it);
    if (n > p.nbytes) {
        signalException("Connection closed: " + peerName() + " sent " + std::to_string(n) + " bytes on slot " +
                        std::to_string(slot) + " for a receive of " + std::to_string(p.nbytes));
        return false;
    }
    rx_.phase = 1;
    rx_.buf = p.buf;
    rx_.offset = p.offset;
    return true;
}

// Under m_: got more bytes of a DATA frame's payload, then of its tag; the receive completes
// once the tag checks out.
bool Pair::bodyArrived(size_t got) {
    size_t n = rx_.f.nbytes;
    size_t payload = std::min(got, n - rx_.pgot);
    if (payload > 0)
        crypto_onetimeauth_update(&rx_.mac, static_cast<unsigned char *>(rx_.buf->ptr) + rx_.offset + rx_.pgot, payload);
    rx_.pgot += payload;
    rx_.tgot += got - payload;
    if (rx_.tgot < COMM_FRAME_TAG_BYTES) return true;
    if (comm_frame_payload_check(&rx_.mac, rx_.tag) != 0) {
        signalException("Connection closed: the payload's tag from " + peerName() + " does not check out");
        return false;
    }
    UnboundBuffer *b = rx_.buf;
    rx_ = Rx();
    b->handleRecvCompletion(rank_);
    return true;
}

// ---- Context -------------------------------------------------------------------------------

struct Context::Incoming : Handler {
    Context *ctx;
    int fd;
    Clock::time_point deadline;
    comm_hs hs{};
    unsigned char buf[COMM_HS_PROOF_BYTES];
    size_t got = 0;
    std::list<std::unique_ptr<Incoming>>::iterator self;
    void handleEvents(uint32_t) override {
        if (fd >= 0) ctx->incomingReadable(this);
    }
};

void Context::ListenHandler::handleEvents(uint32_t) { ctx->acceptAll(); }

constexpr milliseconds Context::kHandshakeBound;
constexpr size_t Context::kMaxHandshaking;

Context::Context(Listener &listener, int rank, int size, const unsigned char key[COMM_KEY_BYTES], const std::string &prefix,
                 milliseconds timeout)
    : gloo::transport::Context(rank, size), prefix_(prefix) {
    if (prefix.size() > COMM_PREFIX_MAX) throw std::invalid_argument("communicator prefix longer than " + std::to_string(COMM_PREFIX_MAX));
    setTimeout(timeout);
    memcpy(key_, key, COMM_KEY_BYTES);
    address_ = gloo::transport::tcp::Address(listener.addressBytes());
    for (int r = 0; r < size; r++)
        if (r != rank) pairs_[r].reset(new Pair(this, r));
    expectIncoming_ = size - 1 - rank; // the higher ranks dial us
    epollFd_ = epoll_create1(EPOLL_CLOEXEC);
    wakeFd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (epollFd_ < 0 || wakeFd_ < 0) {
        int e = errno;
        if (epollFd_ >= 0) ::close(epollFd_);
        if (wakeFd_ >= 0) ::close(wakeFd_);
        ioError("data plane: epoll: " + errnoStr(e));
    }
    struct epoll_event ev = {};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;
    epoll_ctl(epollFd_, EPOLL_CTL_ADD, wakeFd_, &ev);
    listenHandler_.ctx = this;
    listenFd_ = listener.release();
    if (expectIncoming_ > 0) {
        ev.data.ptr = static_cast<Handler *>(&listenHandler_);
        epoll_ctl(epollFd_, EPOLL_CTL_ADD, listenFd_, &ev);
    } else {
        ::close(listenFd_);
        listenFd_ = -1;
    }
    loop_ = std::thread([this] { loop(); });
}

Context::~Context() {
    uint64_t one = 1;
    if (write(wakeFd_, &one, sizeof one) < 0) {
    }
    if (loop_.joinable()) loop_.join();
    for (auto &in : incoming_) ::close(in->fd);
    incoming_.clear();
    if (listenFd_ >= 0) ::close(listenFd_);
    pairs_.clear(); // before the epoll descriptor they unregister from
    ::close(epollFd_);
    ::close(wakeFd_);
    sodium_memzero(key_, sizeof key_);
}

std::unique_ptr<gloo::transport::Pair> &Context::createPair(int rank) { return pairs_.at(rank); }

std::unique_ptr<gloo::transport::UnboundBuffer> Context::createUnboundBuffer(void *ptr, size_t size) {
    return std::unique_ptr<gloo::transport::UnboundBuffer>(new UnboundBuffer(shared_from_this(), ptr, size));
}

void Context::signalException(const std::string &msg) {
    for (int r = 0; r < size; r++)
        if (r != rank) pair(r)->signalExceptionExternal(msg);
}

std::vector<int> Context::dupSockets() {
    std::vector<int> out;
    for (int r = 0; r < size; r++) {
        if (r == rank) continue;
        int fd = pair(r)->dupSocket();
        if (fd >= 0) out.push_back(fd);
    }
    return out;
}

void Context::pairConnected() {
    std::lock_guard<std::mutex> lock(connMutex_);
    connected_++;
    connCv_.notify_all();
}

void Context::connectAll(const std::vector<std::vector<char>> &theirs) {
    Clock::time_point deadline = Clock::now() + getTimeout();
    for (int r = 0; r < rank; r++) dial(r, theirs.at(r), deadline);
    std::unique_lock<std::mutex> lock(connMutex_);
    bool done = connCv_.wait_until(lock, deadline, [&] {
        for (int r = rank + 1; r < size; r++) pair(r)->connected(); // rethrows a pair's failure
        return connected_ == size - 1;
    });
    if (done) return;
    std::string missing;
    for (int r = rank + 1; r < size; r++)
        if (!pair(r)->connected()) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    throw Timeout("Connect timeout: rank(s) " + missing + " did not connect (with the job's key) within " +
            std::to_string(getTimeout().count()) + " ms");
}

// Dials `peer` and runs the handshake, again after a failure that a stranger can cause (the
// acceptor dropped us for a newer connection, or whoever answered could not prove the key),
// until the deadline. A refused connection fails at once: the peer's listener is gone.
void Context::dial(int peer, const std::vector<char> &bytes, Clock::time_point deadline) {
    gloo::transport::tcp::Address addr(bytes);
    const struct sockaddr_storage &ss = addr.getSockaddr();
    socklen_t sslen = ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    std::string why;
    for (int attempt = 0;; attempt++) {
        if (attempt > 0) {
            if (Clock::now() + milliseconds(20) >= deadline)
                throw Timeout("Connect timeout: rank " + std::to_string(peer) + " at " + addr.str() + ": " + why);
            std::this_thread::sleep_for(milliseconds(std::min(20 * attempt, 200)));
        }
        int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) ioError("data plane: socket: " + errnoStr(errno));
        setNoDelay(fd);
        int rv = ::connect(fd, reinterpret_cast<const struct sockaddr *>(&ss), sslen);
        if (rv != 0 && errno != EINPROGRESS) {
            int e = errno;
            ::close(fd);
            if (e == ECONNREFUSED) ioError("connect to rank " + std::to_string(peer) + " at " + addr.str() + ": " + errnoStr(e));
            why = errnoStr(e);
            continue;
        }
        // No bound of its own: whoever listens at the address the rendezvous gave is the peer
        // or a squatter on a dead peer's port; giving up early on a slow peer (its acceptor may
        // have attached already) would only fail the communicator.
        Clock::time_point attemptDeadline = deadline;
        if (rv != 0) {
            struct pollfd pfd = {fd, POLLOUT, 0};
            int pr;
            do pr = poll(&pfd, 1, msLeft(attemptDeadline));
            while (pr < 0 && errno == EINTR);
            int err = 0;
            socklen_t len = sizeof err;
            if (pr <= 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
                ::close(fd);
                if (err == ECONNREFUSED)
                    ioError("connect to rank " + std::to_string(peer) + " at " + addr.str() + ": " + errnoStr(err));
                why = pr <= 0 ? std::string("connect timed out") : errnoStr(err);
                continue;
            }
        }
        comm_hs hs{};
        hs.size = static_cast<uint32_t>(size);
        hs.dialer = static_cast<uint32_t>(rank);
        hs.acceptor = static_cast<uint32_t>(peer);
        snprintf(hs.prefix, sizeof hs.prefix, "%s", prefix_.c_str());
        unsigned char hello[COMM_HS_HELLO_BYTES], proof[COMM_HS_PROOF_BYTES], confirm[COMM_HS_CONFIRM_BYTES];
        int hr = COMM_HS_OK;
        why = ioFull(fd, hello, sizeof hello, false, attemptDeadline);
        if (why.empty() && (hr = comm_hs_parse_hello(&hs, hello, sizeof hello)) != COMM_HS_OK) why = comm_hs_result_str(hr);
        if (why.empty()) {
            comm_hs_proof(&hs, key_, proof);
            why = ioFull(fd, proof, sizeof proof, true, attemptDeadline);
        }
        if (why.empty()) why = ioFull(fd, confirm, sizeof confirm, false, attemptDeadline);
        if (why.empty() && (hr = comm_hs_check_confirm(&hs, key_, confirm, sizeof confirm)) != COMM_HS_OK)
            why = comm_hs_result_str(hr);
        if (!why.empty()) {
            ::close(fd);
            why = "handshake: " + why;
            continue;
        }
        comm_session s;
        comm_hs_session(&hs, key_, 1, &s);
        bool ok = pair(peer)->attach(fd, s, true);
        sodium_memzero(&s, sizeof s);
        if (!ok) {
            ::close(fd);
            pair(peer)->connected(); // rethrows its failure, if that is why
            ioError("connect to rank " + std::to_string(peer) + ": the pair is already connected");
        }
        return;
    }
}

void Context::loop() {
    struct epoll_event evs[64];
    for (;;) {
        int wait = -1;
        if (!incoming_.empty()) wait = std::max(1, msLeft(incoming_.front()->deadline));
        int n = epoll_wait(epollFd_, evs, 64, wait);
        if (n < 0 && errno != EINTR) return;
        for (int i = 0; i < n; i++) {
            Handler *h = static_cast<Handler *>(evs[i].data.ptr);
            if (h == nullptr) return; // woken to stop
            h->handleEvents(evs[i].events);
        }
        dropped_.clear();
        // Whoever has not proved the key in time is dropped (the list is in arrival order).
        Clock::time_point now = Clock::now();
        while (!incoming_.empty() && incoming_.front()->deadline <= now) dropIncoming(incoming_.front().get());
        dropped_.clear();
    }
}

// Closes the connection; the object lives on until the events in hand are handled.
void Context::dropIncoming(Incoming *in) {
    if (in->fd >= 0) {
        epoll_ctl(epollFd_, EPOLL_CTL_DEL, in->fd, nullptr);
        ::close(in->fd);
        in->fd = -1;
    }
    dropped_.splice(dropped_.end(), incoming_, in->self);
}

void Context::acceptAll() {
    for (;;) {
        if (listenFd_ < 0) return;
        int fd = accept4(listenFd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return; // EAGAIN, or a failure for this one connection only (ECONNABORTED, EMFILE, ...)
        if (incoming_.size() >= kMaxHandshaking + 2 * static_cast<size_t>(expectIncoming_))
            dropIncoming(incoming_.front().get());
        std::unique_ptr<Incoming> in(new Incoming());
        in->ctx = this;
        in->fd = fd;
        in->deadline = Clock::now() + kHandshakeBound;
        in->hs.size = static_cast<uint32_t>(size);
        in->hs.acceptor = static_cast<uint32_t>(rank);
        snprintf(in->hs.prefix, sizeof in->hs.prefix, "%s", prefix_.c_str());
        unsigned char hello[COMM_HS_HELLO_BYTES];
        comm_hs_hello(&in->hs, hello);
        if (::send(fd, hello, sizeof hello, MSG_NOSIGNAL | MSG_DONTWAIT) != static_cast<ssize_t>(sizeof hello)) {
            ::close(fd);
            continue;
        }
        struct epoll_event ev = {};
        ev.events = EPOLLIN;
        ev.data.ptr = static_cast<Handler *>(in.get());
        if (epoll_ctl(epollFd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
            ::close(fd);
            continue;
        }
        incoming_.push_back(std::move(in));
        incoming_.back()->self = std::prev(incoming_.end());
    }
}

// Loop thread: PROOF arrives; anything else (junk, a wrong proof, a close) drops the connection
// without another byte sent.
void Context::incomingReadable(Incoming *in) {
    ssize_t rv = ::recv(in->fd, in->buf + in->got, sizeof in->buf - in->got, MSG_DONTWAIT);
    if (rv < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (rv <= 0) {
        dropIncoming(in);
        return;
    }
    in->got += static_cast<size_t>(rv);
    if (in->got < sizeof in->buf) return;
    int r = comm_hs_check_proof(&in->hs, key_, in->buf, sizeof in->buf);
    // The higher rank dials: a proof from a lower rank is no connection we expect.
    if (r != COMM_HS_OK || static_cast<int>(in->hs.dialer) < rank) {
        dropIncoming(in);
        return;
    }
    unsigned char confirm[COMM_HS_CONFIRM_BYTES];
    comm_hs_confirm(&in->hs, key_, confirm);
    int fd = in->fd;
    epoll_ctl(epollFd_, EPOLL_CTL_DEL, fd, nullptr);
    int dialer = static_cast<int>(in->hs.dialer);
    comm_session s;
    comm_hs_session(&in->hs, key_, 0, &s);
    in->fd = -1;
    dropped_.splice(dropped_.end(), incoming_, in->self);
    bool ok = ::send(fd, confirm, sizeof confirm, MSG_NOSIGNAL | MSG_DONTWAIT) == static_cast<ssize_t>(sizeof confirm) &&
              pair(dialer)->attach(fd, s, false);
    sodium_memzero(&s, sizeof s);
    if (!ok) {
        ::close(fd);
        return;
    }
    if (++gotIncoming_ == expectIncoming_ && listenFd_ >= 0) {
        // Every peer that dials us is here: nobody else has any business with this listener.
        epoll_ctl(epollFd_, EPOLL_CTL_DEL, listenFd_, nullptr);
        ::close(listenFd_);
        listenFd_ = -1;
        while (!incoming_.empty()) dropIncoming(incoming_.front().get());
    }
}

} // namespace dpauth
