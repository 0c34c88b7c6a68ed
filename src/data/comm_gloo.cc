// comm_gloo.cc — the C API of comm.h over Gloo's algorithms on an authenticating TCP transport
// of our own (comm_gloo_transport.cc: every connection proves the job's key, every frame is
// authenticated) with a password-capable Redis rendezvous store. The only C++ in DeadPool (with
// the transport): every entry point is extern "C" and noexcept in practice (each one catches
// everything and turns it into a comm_status).
//
// Design notes
//  * Rendezvous: gloo::rendezvous::RedisStore cannot AUTH, and Gloo's connectFullMesh costs
//    O(N) sequential store round trips per rank, so RedisMesh below does the rendezvous over
//    hiredis in a constant number of round trips per rank and MeshContext connects the
//    transport's pairs from it. Keys are "<prefix>/..."; the caller makes the prefix unique per
//    job and epoch. Keys get a TTL so dead epochs do not pile up.
//  * A communicator cannot be repaired. The first failing call records its status and message;
//    every later call returns that status at once without touching Gloo. On that first failure we
//    also close every pair, so peers blocked on us (e.g. the ring neighbour that was waiting for
//    our segment) see "connection closed" at once instead of waiting out their own timeout: one
//    dead rank then turns into prompt errors on all survivors.
//  * Tags: a per-communicator counter gives each collective its own Gloo slot, so consecutive
//    collectives never match each other's messages. All ranks issue collectives in the same order,
//    so the counters agree.
//  * size 1: no Gloo, no store; collectives are no-ops or local copies.

#include "comm.h"
#include "protocol.h"
#include "redis_connect.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <system_error>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/address.h>

#include "comm_gloo_transport.h"

namespace {

// Thrown by the store for Redis trouble (unreachable, refused, protocol error): maps to
// COMM_ERR_STORE. Derives from IoException so Gloo treats it like any store I/O failure.
struct StoreError : public gloo::IoException {
    explicit StoreError(const std::string &msg) : gloo::IoException(msg) {}
};

// Thrown when the rendezvous keys of other ranks do not appear in time: COMM_ERR_TIMEOUT.
struct StoreTimeout : public gloo::IoException {
    explicit StoreTimeout(const std::string &msg) : gloo::IoException(msg) {}
};

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The rendezvous of one communicator: every rank learns, for each peer, the address of the
// peer's listening socket for their pair (this Gloo gives each pair its own socket), in a
// constant number of Redis round trips per rank whatever the world size (three when no rank
// waits; the connection's AUTH rides with the first one):
//   publish  one pipeline: HSET <prefix>/m/<rank> with the address for every peer and the host
//            name, INCR <prefix>/n (arrivals), TTLs;
//   wait     until <prefix>/n reaches size: the rank that completes it pushes a wake-up onto
//            every other rank's list <prefix>/w/<r> (one pipeline); the others wait in BLPOP on
//            their own list, kAbortCheck at a time (Redis resolves a BLPOP timeout only at its
//            `hz`, 10 per second by default, so such a check can take 100 ms: whoever sets the
//            abort key also pushes onto the lists, comm_wake_key, which ends the wait at once);
//   fetch    one pipeline: HMGET <prefix>/m/<peer> <rank> host, for every peer.
// (The keys' names are protocol.h's: proto_rdzv_key.) Every round trip first checks the abort
// key (EXISTS, in the same pipeline), so a closed epoch ends a wait within kAbortCheck. Bytes:
// each rank writes and reads one address per peer, O(N) per rank.
// Gloo's own connectFullMesh instead fetches every peer's whole address list (O(N^2) bytes per
// rank), one GET after one EXISTS per peer in rank order, polled with sleeps, and connects the
// pairs one at a time in rank order, so a rank waits on ranks that wait on others.
class RedisMesh {
  public:
    RedisMesh(const std::string &host, int port, const char *password, const std::string &prefix, milliseconds timeout,
              const char *abort_key, int rank, int size)
        : prefix_(prefix), timeout_(timeout), abortKey_(abort_key ? abort_key : ""), rank_(rank), size_(size) {
        long ms = std::max<long>(1, static_cast<long>(timeout.count()));
        struct timeval tv;
        tv.tv_sec = ms / 1000;
        tv.tv_usec = (ms % 1000) * 1000;
        ctx_ = dp_redis_connect(host.c_str(), port, tv); // a path: the job's unix socket
        if (ctx_ == nullptr) throw StoreError("redis: cannot allocate a connection context");
        if (ctx_->err) {
            std::string msg = "redis: connect to " + host + ":" + std::to_string(port) + " failed: " + ctx_->errstr;
            redisFree(ctx_);
            ctx_ = nullptr;
            throw StoreError(msg);
        }
        // Bound every later command too (a BLPOP waits at most kAbortCheck), so a hung Redis
        // cannot block us forever.
        redisSetTimeout(ctx_, tv);
        // Keys outlive the rendezvous by a comfortable margin, then expire.
        ttl_ = std::to_string(std::max<long long>(3600, 2 * (static_cast<long long>(ms) / 1000 + 1)));
        // AUTH goes out with the first pipeline (Redis runs it first): no round trip of its own.
        if (password != nullptr && password[0] != '\0') auth_ = password;
    }

    ~RedisMesh() {
        if (ctx_ != nullptr) redisFree(ctx_);
    }

    RedisMesh(const RedisMesh &) = delete;
    RedisMesh &operator=(const RedisMesh &) = delete;

    // Publishes this rank's record: addrs[i] is our address for peer i (empty for ourselves).
    // Returns how many ranks had published, ourselves included.
    long long publish(const std::vector<std::vector<char>> &addrs, const std::string &hostname) {
        std::vector<std::string> hset = {"HSET", key(PROTO_RDZV_MEMBER, rank_), PROTO_RDZV_HOST_FIELD, hostname};
        for (int i = 0; i < size_; i++) {
            if (i == rank_) continue;
            hset.push_back(std::to_string(i));
            hset.push_back(std::string(addrs[i].begin(), addrs[i].end()));
        }
        Replies r = pipelineUnlessAborted({hset, {"EXPIRE", key(PROTO_RDZV_MEMBER, rank_), ttl_},
                                           {"INCR", key(PROTO_RDZV_ARRIVALS)}, {"EXPIRE", key(PROTO_RDZV_ARRIVALS), ttl_}});
        for (size_t i = 0; i < r.size(); i++)
            if (r[i]->type == REDIS_REPLY_ERROR)
                throw StoreError("redis: publishing the address of rank " + std::to_string(rank_) + " failed: " +
                                 std::string(r[i]->str, r[i]->len));
        if (r[2]->type != REDIS_REPLY_INTEGER) throw StoreError("redis: INCR of the arrivals gave no number");
        return r[2]->integer;
    }

    // The last rank to arrive wakes the others; the others wait for that.
    void waitForAll(long long arrived) {
        if (arrived > size_)
            throw StoreError("rendezvous " + prefix_ + ": " + std::to_string(arrived) + " ranks joined a communicator of " +
                             std::to_string(size_));
        if (arrived == size_) {
            std::vector<std::vector<std::string>> cmds;
            for (int i = 0; i < size_; i++) {
                if (i == rank_) continue;
                cmds.push_back({"RPUSH", key(PROTO_RDZV_WAKE, i), "1"});
                cmds.push_back({"EXPIRE", key(PROTO_RDZV_WAKE, i), ttl_});
            }
            Replies r = pipeline(cmds);
            for (size_t i = 0; i < r.size(); i++)
                if (r[i]->type == REDIS_REPLY_ERROR)
                    throw StoreError("redis: waking the other ranks failed: " + std::string(r[i]->str, r[i]->len));
            return;
        }
        Clock::time_point deadline = Clock::now() + timeout_;
        std::string mine = key(PROTO_RDZV_WAKE, rank_);
        for (;;) {
            Clock::time_point now = Clock::now();
            if (now >= deadline) {
                long long n = arrivals();
                throw StoreTimeout("rendezvous: Timed out waiting for " + std::to_string(size_ - n) + " of " +
                                   std::to_string(size_) + " ranks in the Redis store (" + prefix_ + ")");
            }
            auto left = std::chrono::duration_cast<milliseconds>(deadline - now);
            long wait_ms = std::max<long>(1, std::min<long>(kAbortCheck.count(), left.count()));
            char secs[32];
            snprintf(secs, sizeof secs, "%.3f", wait_ms / 1000.0);
            Replies r = pipelineUnlessAborted({{"BLPOP", mine, secs}});
            const redisReply *pop = r[0].get();
            if (pop->type == REDIS_REPLY_ERROR)
                throw StoreError("redis: BLPOP " + mine + " failed: " + std::string(pop->str, pop->len));
            if (pop->type == REDIS_REPLY_ARRAY) {
                const redisReply *v = pop->elements == 2 ? pop->element[1] : nullptr;
                if (v != nullptr && v->type == REDIS_REPLY_STRING && std::string(v->str, v->len) == kWakeAbort)
                    throw StoreError("rendezvous aborted: woken by " + abortKey_);
                return; // woken: everyone has published
            }
        }
    }

    // Every peer's address for this rank, and whether the peer runs on our host.
    void fetch(std::vector<std::vector<char>> &addrs, std::vector<std::string> &hosts) {
        std::vector<std::vector<std::string>> cmds;
        for (int i = 0; i < size_; i++)
            if (i != rank_) cmds.push_back({"HMGET", key(PROTO_RDZV_MEMBER, i), std::to_string(rank_), PROTO_RDZV_HOST_FIELD});
        Replies r = pipelineUnlessAborted(cmds);
        addrs.assign(size_, {});
        hosts.assign(size_, "");
        size_t k = 0;
        for (int i = 0; i < size_; i++) {
            if (i == rank_) continue;
            const redisReply *e = r[k++].get();
            if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 || e->element[0]->type != REDIS_REPLY_STRING ||
                e->element[1]->type != REDIS_REPLY_STRING)
                throw StoreError("rendezvous " + prefix_ + ": rank " + std::to_string(i) + " published no address for rank " +
                                 std::to_string(rank_));
            addrs[i].assign(e->element[0]->str, e->element[0]->str + e->element[0]->len);
            hosts[i].assign(e->element[1]->str, e->element[1]->len);
        }
    }

    unsigned long roundTrips() const { return roundTrips_; }

  private:
    struct FreeReply {
        void operator()(redisReply *r) const { freeReplyObject(r); }
    };
    using Reply = std::unique_ptr<redisReply, FreeReply>;
    using Replies = std::vector<Reply>;

    static constexpr milliseconds kAbortCheck{20};
    static constexpr const char *kWakeAbort = COMM_WAKE_ABORT;

    // One of the rendezvous's keys under the prefix (protocol.h: their names are spelled there).
    std::string key(proto_rdzv which, int rank = 0) const {
        char k[PROTO_RDZV_KEY_MAX];
        if (proto_rdzv_key(k, sizeof k, prefix_.c_str(), which, rank) != 0)
            throw StoreError("rendezvous " + prefix_ + ": a key longer than " + std::to_string(PROTO_RDZV_KEY_MAX) + " bytes");
        return k;
    }

    long long arrivals() {
        try {
            Replies r = pipeline({{"GET", key(PROTO_RDZV_ARRIVALS)}});
            if (r[0]->type == REDIS_REPLY_STRING) return std::atoll(std::string(r[0]->str, r[0]->len).c_str());
        } catch (const StoreError &) {
        }
        return 0;
    }

    // The commands preceded by a check of the abort key, in the same round trip: the
    // rendezvous ends when the key exists (the job closed this epoch: a peer will never come,
    // or has already left). The commands have run then too: they only touch this epoch's keys.
    Replies pipelineUnlessAborted(const std::vector<std::vector<std::string>> &cmds) {
        if (abortKey_.empty()) return pipeline(cmds);
        std::vector<std::vector<std::string>> all;
        all.push_back({"EXISTS", abortKey_});
        all.insert(all.end(), cmds.begin(), cmds.end());
        Replies r = pipeline(all);
        if (r[0]->type == REDIS_REPLY_INTEGER && r[0]->integer > 0)
            throw StoreError("rendezvous aborted: " + abortKey_ + " is set");
        r.erase(r.begin());
        return r;
    }

    // Sends the commands (argv, binary-safe) together and reads every reply: one round trip.
    // The connection's AUTH goes first on its first use. Throws StoreError on a connection
    // failure (the context is then dropped) or a refused AUTH.
    Replies pipeline(const std::vector<std::vector<std::string>> &cmds) {
        if (ctx_ == nullptr) throw StoreError("redis: not connected");
        bool auth = !auth_.empty();
        if (auth) {
            const char *argv[2] = {"AUTH", auth_.c_str()};
            size_t lens[2] = {4, auth_.size()};
            if (redisAppendCommandArgv(ctx_, 2, argv, lens) != REDIS_OK) fail("cannot queue AUTH");
            std::fill(auth_.begin(), auth_.end(), '\0');
            auth_.clear();
        }
        for (const auto &args : cmds) {
            std::vector<const char *> argv;
            std::vector<size_t> lens;
            for (const std::string &a : args) {
                argv.push_back(a.data());
                lens.push_back(a.size());
            }
            if (redisAppendCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data()) != REDIS_OK)
                fail("cannot queue a command");
        }
        roundTrips_++;
        Replies out;
        for (size_t i = 0; i < cmds.size() + (auth ? 1 : 0); i++) {
            void *raw = nullptr;
            if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) fail(ctx_->err ? ctx_->errstr : "no reply");
            out.emplace_back(static_cast<redisReply *>(raw));
        }
        if (auth) {
            if (out[0]->type != REDIS_REPLY_STATUS)
                throw StoreError("redis: AUTH refused: " +
                                 (out[0]->type == REDIS_REPLY_ERROR ? std::string(out[0]->str, out[0]->len)
                                                                    : std::string("unexpected reply")));
            out.erase(out.begin());
        }
        return out;
    }

    [[noreturn]] void fail(const std::string &why) {
        std::string msg = "redis: connection failed: " + why;
        redisFree(ctx_); // a context in error state is unusable
        ctx_ = nullptr;
        throw StoreError(msg);
    }

    redisContext *ctx_ = nullptr;
    const std::string prefix_;
    const milliseconds timeout_;
    const std::string abortKey_;
    const int rank_, size_;
    std::string ttl_ = "3600";
    std::string auth_; // the password until the first pipeline has sent it
    unsigned long roundTrips_ = 0;
};

// A full-mesh Gloo context built by RedisMesh over the authenticating transport: one listener
// per communicator (every peer is published the same address), the higher rank of each pair
// dials the lower one, and the connection proves the job's key for this communicator (the store
// prefix) and both ranks before it carries a byte. (device_ and transportContext_ are Gloo's
// protected members, which is what its own connectFullMesh sets; there is no device here.)
class MeshContext : public gloo::rendezvous::Context {
  public:
    MeshContext(int rank, int size) : gloo::rendezvous::Context(rank, size) {}

    // Returns the Redis round trips the rendezvous took; *wait_ms: from publishing to having
    // every peer's address, *connect_ms: connecting the pairs; conns[0] / conns[1]: the pair
    // connections dialed / accepted. sockets: duplicates of the pairs' connections, for comm_abort.
    unsigned long connect(RedisMesh &store, const std::string &bindHost, const unsigned char *key,
                          const std::string &prefix, double *wait_ms, double *connect_ms, int conns[2],
                          std::vector<int> &sockets) {
        dpauth::Listener listener(bindHost);
        auto tctx = std::make_shared<dpauth::Context>(listener, rank, size, key, prefix, getTimeout());
        std::vector<char> self = tctx->address().bytes();
        std::vector<std::vector<char>> mine(size), theirs;
        for (int i = 0; i < size; i++)
            if (i != rank) mine[i] = self;
        char hostname[256] = "";
        if (gethostname(hostname, sizeof hostname - 1) != 0) throw std::system_error(errno, std::system_category());
        Clock::time_point t0 = Clock::now();
        store.waitForAll(store.publish(mine, hostname));
        std::vector<std::string> hosts;
        store.fetch(theirs, hosts);
        Clock::time_point t1 = Clock::now();
        tctx->connectAll(theirs);
        conns[0] = tctx->dialed();
        conns[1] = tctx->accepted();
        sockets = tctx->dupSockets();
        *wait_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
        *connect_ms = std::chrono::duration<double, std::milli>(Clock::now() - t1).count();
        transportContext_ = std::move(tctx);
        return store.roundTrips();
    }
};

// The address the communicator of `rank` listens on. (Gloo's tcp transport gave every pair a
// listening socket of its own; ours has one per communicator.) Bound to port 0: a full mesh of N
// ranks on one host binds N ports per communicator, N(N-1) with Gloo's, and once the
// half of the ephemeral range that bind(2) prefers is taken, the kernel scans it for every
// further bind (0.7 ms each at 4,000 ports bound here, 4 ms at 16,000: 128 ranks spent ~10 s
// of CPU binding before their rendezvous). On loopback, every rank therefore listens on a
// loopback address of its own, 127.77.x.y (all of 127/8 is the host), where a port may be bound
// again without conflict: 15 us per bind whatever the count. Any other address is used as is.
std::string deviceHost(const char *bind_host, int rank) {
    std::string h = (bind_host != nullptr && bind_host[0] != '\0') ? bind_host : "127.0.0.1";
    if (h != "127.0.0.1" || rank < 0 || rank >= 250 * 250) return h;
    char ip[32];
    snprintf(ip, sizeof ip, "127.77.%d.%d", rank / 250, rank % 250 + 1);
    return ip;
}

// The barrier's buffer is Gloo's own (protected): reachable for comm_abort from a subclass.
struct AbortableBarrierOptions : public gloo::BarrierOptions {
    explicit AbortableBarrierOptions(const std::shared_ptr<gloo::Context> &ctx) : gloo::BarrierOptions(ctx) {}
    gloo::transport::UnboundBuffer *waitBuffer() { return buffer.get(); }
};

// Element-wise float sum for the ring: c = a + b. Fixed operand order, so the result depends
// only on the ring topology, never on timing. (gloo::sum<float> loops with an int counter.)
void sumFloat(void *c_, const void *a_, const void *b_, size_t n) {
    float *c = static_cast<float *>(c_);
    const float *a = static_cast<const float *>(a_);
    const float *b = static_cast<const float *>(b_);
    for (size_t i = 0; i < n; i++) c[i] = a[i] + b[i];
}

// The other element types and reductions (comm_allreduce), in the same fixed operand order.
float bf16ToFloat(uint16_t v) {
    uint32_t u = static_cast<uint32_t>(v) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
uint16_t floatToBf16(float f) { // round to nearest even, as torch; a NaN stays a (quiet) NaN
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if (f != f) return static_cast<uint16_t>((u >> 16) | 0x40);
    u += 0x7FFF + ((u >> 16) & 1);
    return static_cast<uint16_t>(u >> 16);
}
struct OpSum { template <typename T> static T apply(T a, T b) { return a + b; } };
struct OpMax { template <typename T> static T apply(T a, T b) { return a != a ? a : b != b ? b : a > b ? a : b; } };
struct OpMin { template <typename T> static T apply(T a, T b) { return a != a ? a : b != b ? b : a < b ? a : b; } };
template <typename T, typename Op>
void reduceTyped(void *c_, const void *a_, const void *b_, size_t n) {
    T *c = static_cast<T *>(c_);
    const T *a = static_cast<const T *>(a_);
    const T *b = static_cast<const T *>(b_);
    for (size_t i = 0; i < n; i++) c[i] = Op::apply(a[i], b[i]);
}
template <typename Op>
void reduceBf16(void *c_, const void *a_, const void *b_, size_t n) {
    uint16_t *c = static_cast<uint16_t *>(c_);
    const uint16_t *a = static_cast<const uint16_t *>(a_);
    const uint16_t *b = static_cast<const uint16_t *>(b_);
    for (size_t i = 0; i < n; i++) c[i] = floatToBf16(Op::apply(bf16ToFloat(a[i]), bf16ToFloat(b[i])));
}
using ReduceFn = void (*)(void *, const void *, const void *, size_t);
template <typename Op>
ReduceFn reduceFor(comm_dtype t) {
    switch (t) {
    case COMM_F32: return reduceTyped<float, Op>;
    case COMM_F64: return reduceTyped<double, Op>;
    case COMM_BF16: return reduceBf16<Op>;
    case COMM_I64: return reduceTyped<int64_t, Op>;
    }
    return nullptr;
}

// Runs fn, converting every exception into a status and a message. Order matters: the more
// specific types first.
template <typename Fn>
comm_status guarded(Fn &&fn, std::string &msg) {
    try {
        fn();
        return COMM_OK;
    } catch (const StoreTimeout &e) {
        msg = e.what();
        return COMM_ERR_TIMEOUT;
    } catch (const StoreError &e) {
        msg = e.what();
        return COMM_ERR_STORE;
    } catch (const dpauth::Timeout &e) {
        msg = e.what();
        return COMM_ERR_TIMEOUT;
    } catch (const gloo::IoException &e) { // the transport's: a peer closed, reset, tampered, aborted
        msg = e.what();
        return COMM_ERR_PEER;
    } catch (const std::bad_alloc &) {
        msg = "out of memory";
        return COMM_ERR_INTERNAL;
    } catch (const std::exception &e) { // gloo::EnforceNotMet and the like: a bug, not a peer
        msg = e.what();
        return COMM_ERR_INTERNAL;
    } catch (...) {
        msg = "unknown exception";
        return COMM_ERR_INTERNAL;
    }
}

void ignoreSigpipeOnce() {
    static std::once_flag once;
    std::call_once(once, [] {
        // Gloo's TCP writes do not pass MSG_NOSIGNAL: a write to a dead peer would kill us.
        // Leave a handler the application installed alone; replace only the default action.
        struct sigaction old;
        if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
    });
}

void writeErr(char *err, size_t errlen, const std::string &msg) {
    if (err == nullptr || errlen == 0) return;
    snprintf(err, errlen, "%s", msg.c_str());
}

} // namespace

struct comm {
    int rank = 0;
    int size = 1;
    int timeout_ms = 0;
    uint32_t tag = 0;
    std::shared_ptr<MeshContext> ctx; // null when size == 1
    unsigned long store_round_trips = 0;
    double wait_ms = 0, connect_ms = 0; // the rendezvous' phases
    int conns[2] = {0, 0};              // pair connections dialed, accepted
    comm_status broken = COMM_OK;
    std::string last_error;
    // comm_abort: duplicates of the pairs' sockets, shut down once (under sockMutex), and the
    // thread that waits for the coordinator's word to do it (on its own Redis connection,
    // watchCtx, which comm_destroy shuts down to end the thread's BLPOP).
    std::vector<int> sockets;
    std::mutex sockMutex;
    bool socketsShut = false;
    std::thread watcher;
    std::mutex watchMutex;
    redisContext *watchCtx = nullptr;
    bool stopping = false;
    // The buffers of the collective in flight (ours, handed to Gloo), and whether comm_abort
    // ran: both under abortMutex, so an abort either sees a collective's buffers or the
    // collective sees the abort before it starts.
    std::mutex abortMutex;
    std::vector<gloo::transport::UnboundBuffer *> inflight;
    bool aborted = false;
    // Groups built on this communicator (comm_create_group): our abort aborts them too, since
    // nobody else tells them that the epoch closed.
    comm *parent = nullptr;
    std::vector<comm *> children;
    std::mutex childMutex; // guards children
    // Sends posted by comm_send, waited for by comm_wait_sends.
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sends;

    // Shuts the pairs' sockets down (the pending operations of every pair fail, here and on
    // the peers), then interrupts the waits of the collective in flight. (Gloo's tcp pair did
    // not fail a send whose bytes were queued when it broke, so a waitSend sat out its whole
    // timeout; our transport fails every queued operation, and the interrupt stays: the
    // shutdown reaches the pairs through the loop thread, the interrupt at once.)
    void abort() {
        shutSockets();
        {
            std::lock_guard<std::mutex> lock(abortMutex);
            aborted = true;
            for (gloo::transport::UnboundBuffer *b : inflight) {
                b->abortWaitSend();
                b->abortWaitRecv();
            }
        }
        std::lock_guard<std::mutex> lock(childMutex); // a child unlinks itself under it before it is freed
        for (comm *k : children) k->abort();
    }

    void shutSockets() {
        std::lock_guard<std::mutex> lock(sockMutex);
        if (socketsShut) return;
        for (int fd : sockets) shutdown(fd, SHUT_RDWR);
        socketsShut = true;
    }
    ~comm() {
        for (int fd : sockets) ::close(fd);
    }
};

namespace {

milliseconds callTimeout(const comm *c, int timeout_ms) {
    return milliseconds(timeout_ms > 0 ? timeout_ms : c->timeout_ms);
}

// Common prologue/epilogue of every collective: refuse on a broken communicator, run the body
// under guarded(), and on failure mark the communicator broken and drop all connections so the
// peers fail fast too.
// While a collective runs, the buffers it waits on are registered for comm_abort.
class Inflight {
  public:
    Inflight(comm *c, std::initializer_list<gloo::transport::UnboundBuffer *> bufs) : c_(c) {
        std::lock_guard<std::mutex> lock(c_->abortMutex);
        aborted_ = c_->aborted;
        for (auto *b : bufs)
            if (b != nullptr) c_->inflight.push_back(b);
    }
    ~Inflight() {
        std::lock_guard<std::mutex> lock(c_->abortMutex);
        c_->inflight.clear();
    }
    bool abortedBefore() const { return aborted_; }

  private:
    comm *c_;
    bool aborted_ = false;
};

bool wasAborted(comm *c) {
    std::lock_guard<std::mutex> lock(c->abortMutex);
    return c->aborted;
}

template <typename Fn>
comm_status runCollective(comm *c, Fn &&body) {
    if (c->broken != COMM_OK) return c->broken;
    std::string msg;
    comm_status s = guarded(body, msg);
    // A collective in flight when the communicator was aborted never counts as done: its
    // interrupted waits may have let it run to the end on partial data.
    if (s == COMM_OK && wasAborted(c)) {
        s = COMM_ERR_PEER;
        msg = "aborted: the epoch was closed";
    }
    if (s != COMM_OK) {
        c->broken = s;
        c->last_error = msg;
        if (c->ctx) {
            std::string ignored;
            guarded([&] { c->ctx->closeConnections(); }, ignored);
        }
        c->shutSockets(); // the duplicates would keep the connections open for the peers
    }
    return s;
}

// The abort watcher: waits (BLPOP, no timeout) on this rank's wake-up list of the epoch's
// rendezvous, empty once the rendezvous is done, until the coordinator closes the epoch and
// pushes COMM_WAKE_ABORT onto it; then shuts the pairs' sockets down, which fails the
// collective in flight here and the peers' at once, instead of one ring neighbour after
// another. Ends when comm_destroy shuts its connection down.
void watchForAbort(comm *c, std::string host, int port, std::string password, std::string key) {
    struct timeval tv = {2, 0};
    redisContext *ctx = dp_redis_connect(host.c_str(), port, tv);
    {
        std::lock_guard<std::mutex> lock(c->watchMutex);
        if (ctx == nullptr || ctx->err || c->stopping) {
            if (ctx != nullptr) redisFree(ctx);
            std::fill(password.begin(), password.end(), '\0');
            return;
        }
        c->watchCtx = ctx;
    }
    bool ok = true;
    if (!password.empty()) {
        redisReply *r = static_cast<redisReply *>(redisCommand(ctx, "AUTH %b", password.data(), password.size()));
        ok = r != nullptr && r->type == REDIS_REPLY_STATUS;
        if (r != nullptr) freeReplyObject(r);
        std::fill(password.begin(), password.end(), '\0');
    }
    struct timeval forever = {0, 0};
    redisSetTimeout(ctx, forever);
    while (ok) {
        redisReply *r = static_cast<redisReply *>(redisCommand(ctx, "BLPOP %b 0", key.data(), key.size()));
        if (r == nullptr) break; // shut down by comm_destroy, or Redis is gone
        bool abort = r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[1]->type == REDIS_REPLY_STRING &&
                     std::string(r->element[1]->str, r->element[1]->len) == COMM_WAKE_ABORT;
        ok = r->type == REDIS_REPLY_ARRAY;
        freeReplyObject(r);
        if (abort) {
            c->abort();
            break;
        }
    }
    std::lock_guard<std::mutex> lock(c->watchMutex);
    c->watchCtx = nullptr;
    redisFree(ctx);
}

} // namespace

extern "C" {

} // extern "C"

namespace {

comm_t *createComm(comm *parent, const comm_store_addr *store, const char *prefix, int rank, int size,
                   const char *bind_host, int timeout_ms, char *err, size_t errlen) {
    writeErr(err, errlen, "");
    if (store == nullptr || store->host == nullptr || prefix == nullptr || prefix[0] == '\0' || size < 1 ||
        rank < 0 || rank >= size || timeout_ms <= 0 || (store->host[0] != '/' && store->port <= 0) || store->port > 65535) {
        writeErr(err, errlen, "comm_create: invalid arguments");
        return nullptr;
    }
    if (size > 1 && store->key == nullptr) {
        writeErr(err, errlen, "comm_create: no data-plane key (comm_store_addr.key): every connection must prove the job's key");
        return nullptr;
    }
    if (strlen(prefix) > COMM_PREFIX_MAX) {
        writeErr(err, errlen, "comm_create: prefix longer than " + std::to_string(COMM_PREFIX_MAX) + " bytes");
        return nullptr;
    }
    ignoreSigpipeOnce();
    comm *c = nullptr;
    std::string msg;
    comm_status s = guarded(
        [&] {
            std::unique_ptr<comm> cc(new comm());
            cc->rank = rank;
            cc->size = size;
            cc->timeout_ms = timeout_ms;
            if (size > 1) {
                milliseconds t(timeout_ms);
                RedisMesh rs(store->host, store->port, store->password, prefix, t, store->abort_key, rank, size);
                cc->ctx = std::make_shared<MeshContext>(rank, size);
                cc->ctx->setTimeout(t);
                cc->store_round_trips = cc->ctx->connect(rs, deviceHost(bind_host, rank), store->key, prefix,
                                                         &cc->wait_ms, &cc->connect_ms, cc->conns, cc->sockets);
                if (store->abort_key != nullptr && parent == nullptr) {
                    char key[512];
                    comm_wake_key(prefix, rank, key, sizeof key);
                    cc->watcher = std::thread(watchForAbort, cc.get(), std::string(store->host), store->port,
                                              std::string(store->password ? store->password : ""), std::string(key));
                }
            }
            c = cc.release();
        },
        msg);
    if (s != COMM_OK) {
        writeErr(err, errlen, std::string("comm_create (") + comm_status_str(s) + "): " + msg);
        return nullptr;
    }
    if (parent != nullptr) {
        c->parent = parent;
        std::lock_guard<std::mutex> lock(parent->childMutex);
        parent->children.push_back(c);
        // An abort that came before we were linked must still reach us.
        std::lock_guard<std::mutex> lock2(parent->abortMutex);
        if (parent->aborted) c->abort();
    }
    return c;
}

} // namespace

extern "C" {

comm_t *comm_create(const comm_store_addr *store, const char *prefix, int rank, int size, const char *bind_host,
                    int timeout_ms, char *err, size_t errlen) {
    return createComm(nullptr, store, prefix, rank, size, bind_host, timeout_ms, err, errlen);
}

comm_t *comm_create_group(comm_t *parent, const comm_store_addr *store, const char *prefix, int rank, int size,
                          const char *bind_host, int timeout_ms, char *err, size_t errlen) {
    if (parent == nullptr) {
        writeErr(err, errlen, "comm_create_group: no parent communicator");
        return nullptr;
    }
    return createComm(parent, store, prefix, rank, size, bind_host, timeout_ms, err, errlen);
}

void comm_destroy(comm_t *c) {
    if (c == nullptr) return;
    if (c->parent != nullptr) {
        std::lock_guard<std::mutex> lock(c->parent->childMutex);
        auto &k = c->parent->children;
        k.erase(std::remove(k.begin(), k.end(), c), k.end());
    }
    {
        std::lock_guard<std::mutex> lock(c->watchMutex);
        c->stopping = true;
        if (c->watchCtx != nullptr) shutdown(c->watchCtx->fd, SHUT_RDWR); // ends its BLPOP
    }
    if (c->watcher.joinable()) c->watcher.join();
    std::string ignored;
    guarded(
        [&] {
            c->sends.clear(); // before their context
            if (c->ctx) {
                c->ctx->closeConnections();
                c->ctx.reset();
            }
        },
        ignored);
    c->shutSockets();
    try {
        delete c;
    } catch (...) {
    }
}

void comm_abort(comm_t *c) {
    if (c != nullptr) c->abort();
}

size_t comm_abort_sockets(const comm_t *c) { return c ? c->sockets.size() : 0; }

void comm_wake_key(const char *prefix, int rank, char *out, size_t len) {
    if (out != nullptr && len > 0) proto_rdzv_key(out, len, prefix, PROTO_RDZV_WAKE, rank);
}

int comm_rank(const comm_t *c) { return c ? c->rank : -1; }
unsigned long comm_store_round_trips(const comm_t *c) { return c ? c->store_round_trips : 0; }

void comm_rendezvous_ms(const comm_t *c, double *wait_ms, double *connect_ms) {
    if (wait_ms != nullptr) *wait_ms = c ? c->wait_ms : 0;
    if (connect_ms != nullptr) *connect_ms = c ? c->connect_ms : 0;
}

void comm_connections(const comm_t *c, int *dialed, int *accepted) {
    if (dialed != nullptr) *dialed = c ? c->conns[0] : 0;
    if (accepted != nullptr) *accepted = c ? c->conns[1] : 0;
}
int comm_size(const comm_t *c) { return c ? c->size : 0; }

comm_status comm_allreduce_sum(comm_t *c, float *buf, size_t n, int timeout_ms) {
    if (c == nullptr || (buf == nullptr && n > 0) || n > SIZE_MAX / sizeof(float)) return COMM_ERR_INVALID;
    if (c->broken != COMM_OK) return c->broken;
    if (n == 0 || c->size == 1) return COMM_OK;
    return runCollective(c, [&] {
        gloo::AllreduceOptions opts(c->ctx);
        auto out = c->ctx->createUnboundBuffer(buf, n * sizeof(float));
        Inflight in(c, {out.get()});
        if (in.abortedBefore()) throw gloo::IoException("aborted: the epoch was closed");
        opts.setOutput<float>(std::move(out));
        opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
        opts.setReduceFunction(sumFloat);
        opts.setTag(c->tag++);
        opts.setTimeout(callTimeout(c, timeout_ms));
        gloo::allreduce(opts);
    });
}

size_t comm_dtype_size(comm_dtype t) {
    switch (t) {
    case COMM_F32: return 4;
    case COMM_F64: return 8;
    case COMM_BF16: return 2;
    case COMM_I64: return 8;
    }
    return 0;
}

comm_status comm_allreduce(comm_t *c, void *buf, size_t n, comm_dtype type, comm_op op, int timeout_ms) {
    size_t es = comm_dtype_size(type);
    if (c == nullptr || es == 0 || op < COMM_SUM || op > COMM_MIN || (buf == nullptr && n > 0) || n > SIZE_MAX / es)
        return COMM_ERR_INVALID;
    if (c->broken != COMM_OK) return c->broken;
    if (n == 0 || c->size == 1) return COMM_OK;
    ReduceFn fn = op == COMM_MAX ? reduceFor<OpMax>(type) : op == COMM_MIN ? reduceFor<OpMin>(type) : reduceFor<OpSum>(type);
    comm_status st = runCollective(c, [&] {
        gloo::AllreduceOptions opts(c->ctx);
        auto out = c->ctx->createUnboundBuffer(buf, n * es);
        Inflight in(c, {out.get()});
        if (in.abortedBefore()) throw gloo::IoException("aborted: the epoch was closed");
        switch (type) { // the element size is all Gloo takes from the type
        case COMM_F32: opts.setOutput<float>(std::move(out)); break;
        case COMM_F64: opts.setOutput<double>(std::move(out)); break;
        case COMM_BF16: opts.setOutput<uint16_t>(std::move(out)); break;
        case COMM_I64: opts.setOutput<int64_t>(std::move(out)); break;
        }
        opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
        opts.setReduceFunction(fn);
        opts.setTag(c->tag++);
        opts.setTimeout(callTimeout(c, timeout_ms));
        gloo::allreduce(opts);
    });
    if (st != COMM_OK || op != COMM_MEAN) return st;
    if (type == COMM_F32) {
        const float inv = 1.0f / static_cast<float>(c->size);
        float *f = static_cast<float *>(buf);
        for (size_t i = 0; i < n; i++) f[i] *= inv;
    } else if (type == COMM_F64) {
        const double inv = 1.0 / static_cast<double>(c->size);
        double *d = static_cast<double *>(buf);
        for (size_t i = 0; i < n; i++) d[i] *= inv;
    } else if (type == COMM_BF16) {
        const float inv = 1.0f / static_cast<float>(c->size);
        uint16_t *h = static_cast<uint16_t *>(buf);
        for (size_t i = 0; i < n; i++) h[i] = floatToBf16(bf16ToFloat(h[i]) * inv);
    } else {
        int64_t *v = static_cast<int64_t *>(buf);
        for (size_t i = 0; i < n; i++) v[i] /= c->size;
    }
    return COMM_OK;
}

comm_status comm_allreduce_mean(comm_t *c, float *buf, size_t n, int timeout_ms) {
    comm_status st = comm_allreduce_sum(c, buf, n, timeout_ms);
    if (st != COMM_OK || c->size == 1) return st;
    const float inv = 1.0f / static_cast<float>(c->size);
    for (size_t i = 0; i < n; i++) buf[i] *= inv;
    return COMM_OK;
}

comm_status comm_allgather(comm_t *c, const float *in, float *out, size_t n, int timeout_ms) {
    if (c == nullptr || ((in == nullptr || out == nullptr) && n > 0) ||
        n > SIZE_MAX / sizeof(float) / static_cast<size_t>(c->size))
        return COMM_ERR_INVALID;
    if (c->broken != COMM_OK) return c->broken;
    if (n == 0) return COMM_OK;
    float *mine = out + static_cast<size_t>(c->rank) * n;
    // Put our contribution in place first (memmove: in may overlap out), then gather in place.
    if (in != mine) memmove(mine, in, n * sizeof(float));
    if (c->size == 1) return COMM_OK;
    return runCollective(c, [&] {
        gloo::AllgatherOptions opts(c->ctx);
        auto o = c->ctx->createUnboundBuffer(out, n * static_cast<size_t>(c->size) * sizeof(float));
        Inflight in(c, {o.get()});
        if (in.abortedBefore()) throw gloo::IoException("aborted: the epoch was closed");
        opts.setOutput<float>(std::move(o));
        opts.setTag(c->tag++);
        opts.setTimeout(callTimeout(c, timeout_ms));
        gloo::allgather(opts);
    });
}

comm_status comm_broadcast(comm_t *c, void *buf, size_t nbytes, int root, int timeout_ms) {
    if (c == nullptr || (buf == nullptr && nbytes > 0) || root < 0 || root >= c->size) return COMM_ERR_INVALID;
    if (c->broken != COMM_OK) return c->broken;
    if (nbytes == 0 || c->size == 1) return COMM_OK;
    return runCollective(c, [&] {
        gloo::BroadcastOptions opts(c->ctx);
        auto o = c->ctx->createUnboundBuffer(buf, nbytes);
        Inflight in(c, {o.get()});
        if (in.abortedBefore()) throw gloo::IoException("aborted: the epoch was closed");
        opts.setOutput<uint8_t>(std::move(o));
        opts.setRoot(root);
        opts.setTag(c->tag++);
        opts.setTimeout(callTimeout(c, timeout_ms));
        gloo::broadcast(opts);
    });
}

comm_status comm_barrier(comm_t *c, int timeout_ms) {
    if (c == nullptr) return COMM_ERR_INVALID;
    if (c->broken != COMM_OK) return c->broken;
    if (c->size == 1) return COMM_OK;
    return runCollective(c, [&] {
        AbortableBarrierOptions opts(c->ctx);
        Inflight in(c, {opts.waitBuffer()});
        if (in.abortedBefore()) throw gloo::IoException("aborted: the epoch was closed");
        opts.setTag(c->tag++);
        opts.setTimeout(callTimeout(c, timeout_ms));
        gloo::barrier(opts);
    });
}

// Point to point: slots of their own, apart from every collective's prefix (gloo/types.h).
constexpr uint8_t kP2PSlotPrefix = 0x70;

comm_status comm_send(comm_t *c, const void *buf, size_t nbytes, int dst, uint32_t tag) {
    if (c == nullptr || (buf == nullptr && nbytes > 0) || dst < 0 || dst >= c->size || dst == c->rank)
        return COMM_ERR_INVALID;
    if (c->broken != COMM_OK) return c->broken;
    if (nbytes == 0) return COMM_OK;
    return runCollective(c, [&] {
        auto b = c->ctx->createUnboundBuffer(const_cast<void *>(buf), nbytes);
        if (wasAborted(c)) throw gloo::IoException("aborted: the epoch was closed");
        b->send(dst, gloo::Slot::build(kP2PSlotPrefix, tag));
        c->sends.push_back(std::move(b));
    });
}

comm_status comm_recv(comm_t *c, void *buf, size_t nbytes, int src, uint32_t tag, int timeout_ms) {
    if (c == nullptr || (buf == nullptr && nbytes > 0) || src < 0 || src >= c->size || src == c->rank)
        return COMM_ERR_INVALID;
    if (c->broken != COMM_OK) return c->broken;
    if (nbytes == 0) return COMM_OK;
    return runCollective(c, [&] {
        auto b = c->ctx->createUnboundBuffer(buf, nbytes);
        Inflight in(c, {b.get()});
        if (in.abortedBefore()) throw gloo::IoException("aborted: the epoch was closed");
        b->recv(src, gloo::Slot::build(kP2PSlotPrefix, tag));
        if (!b->waitRecv(callTimeout(c, timeout_ms))) throw gloo::IoException("aborted: the epoch was closed");
    });
}

comm_status comm_wait_sends(comm_t *c, int timeout_ms) {
    if (c == nullptr) return COMM_ERR_INVALID;
    if (c->broken != COMM_OK) return c->broken;
    comm_status s = runCollective(c, [&] {
        for (auto &b : c->sends) {
            Inflight in(c, {b.get()});
            if (in.abortedBefore()) throw gloo::IoException("aborted: the epoch was closed");
            if (!b->waitSend(callTimeout(c, timeout_ms))) throw gloo::IoException("aborted: the epoch was closed");
        }
    });
    if (s == COMM_OK) c->sends.clear();
    return s;
}

const char *comm_last_error(const comm_t *c) { return c ? c->last_error.c_str() : ""; }

const char *comm_status_str(comm_status s) {
    switch (s) {
    case COMM_OK: return "ok";
    case COMM_ERR_PEER: return "peer failure";
    case COMM_ERR_TIMEOUT: return "timeout";
    case COMM_ERR_INVALID: return "invalid argument";
    case COMM_ERR_STORE: return "store failure";
    case COMM_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

} // extern "C"
