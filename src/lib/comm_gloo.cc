// comm_gloo.cc — the C API of comm.h over Gloo (TCP transport) with a password-capable Redis
// rendezvous store. The only C++ in DeadPool: every entry point is extern "C" and noexcept in
// practice (each one catches everything and turns it into a comm_status).
//
// Design notes
//  * Rendezvous: gloo::rendezvous::RedisStore cannot AUTH, so RedisAuthStore below implements
//    gloo::rendezvous::Store over hiredis directly. Keys are "<prefix>/<gloo key>"; the caller
//    makes the prefix unique per job and epoch. Keys get a TTL so dead epochs do not pile up.
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

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/time.h>

#include <hiredis/hiredis.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

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

class RedisAuthStore : public gloo::rendezvous::Store {
  public:
    RedisAuthStore(const std::string &host, int port, const char *password, const std::string &prefix,
                   milliseconds timeout, const char *abort_key)
        : prefix_(prefix), timeout_(timeout), abortKey_(abort_key ? abort_key : "") {
        long ms = std::max<long>(1, static_cast<long>(timeout.count()));
        struct timeval tv;
        tv.tv_sec = ms / 1000;
        tv.tv_usec = (ms % 1000) * 1000;
        ctx_ = redisConnectWithTimeout(host.c_str(), port, tv);
        if (ctx_ == nullptr) throw StoreError("redis: cannot allocate a connection context");
        if (ctx_->err) {
            std::string msg = "redis: connect to " + host + ":" + std::to_string(port) + " failed: " + ctx_->errstr;
            redisFree(ctx_);
            ctx_ = nullptr;
            throw StoreError(msg);
        }
        // Bound every later command too, so a hung Redis cannot block us forever.
        redisSetTimeout(ctx_, tv);
        // Keys outlive the rendezvous by a comfortable margin, then expire.
        ttl_s_ = std::max<long long>(3600, 2 * (static_cast<long long>(ms) / 1000 + 1));
        if (password != nullptr && password[0] != '\0') {
            redisReply *r = command({"AUTH", password});
            bool ok = r->type == REDIS_REPLY_STATUS && std::string(r->str, r->len) == "OK";
            std::string why = r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len) : "unexpected reply";
            freeReplyObject(r);
            if (!ok) {
                redisFree(ctx_);
                ctx_ = nullptr;
                throw StoreError("redis: AUTH refused: " + why);
            }
        }
    }

    ~RedisAuthStore() override {
        if (ctx_ != nullptr) redisFree(ctx_);
    }

    RedisAuthStore(const RedisAuthStore &) = delete;
    RedisAuthStore &operator=(const RedisAuthStore &) = delete;

    void set(const std::string &key, const std::vector<char> &data) override {
        std::string k = full(key);
        std::string ttl = std::to_string(ttl_s_);
        std::lock_guard<std::mutex> lock(m_);
        redisReply *r = command({k, std::string(data.begin(), data.end()), "EX", ttl}, "SET");
        bool ok = r->type == REDIS_REPLY_STATUS;
        std::string why = r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len) : "";
        freeReplyObject(r);
        if (!ok) throw StoreError("redis: SET " + k + " failed: " + why);
    }

    std::vector<char> get(const std::string &key) override {
        throwIfAborted();
        std::string k = full(key);
        Clock::time_point deadline = Clock::now() + timeout_;
        milliseconds backoff(1);
        for (;;) {
            {
                std::lock_guard<std::mutex> lock(m_);
                redisReply *r = command({"GET", k});
                if (r->type == REDIS_REPLY_STRING) {
                    std::vector<char> out(r->str, r->str + r->len);
                    freeReplyObject(r);
                    return out;
                }
                bool nil = r->type == REDIS_REPLY_NIL;
                std::string why = r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len) : "";
                freeReplyObject(r);
                if (!nil) throw StoreError("redis: GET " + k + " failed: " + why);
            }
            sleepOrThrow(deadline, backoff, "key " + k);
        }
    }

    void wait(const std::vector<std::string> &keys) override { wait(keys, timeout_); }

    void wait(const std::vector<std::string> &keys, const milliseconds &timeout) override {
        throwIfAborted();
        milliseconds t = timeout.count() > 0 ? timeout : timeout_;
        Clock::time_point deadline = Clock::now() + t;
        milliseconds backoff(1);
        size_t next = 0; // keys[0..next) are known to exist
        while (next < keys.size()) {
            std::string k = full(keys[next]);
            long long exists;
            {
                std::lock_guard<std::mutex> lock(m_);
                redisReply *r = command({"EXISTS", k});
                bool ok = r->type == REDIS_REPLY_INTEGER;
                exists = ok ? r->integer : 0;
                std::string why = r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len) : "";
                freeReplyObject(r);
                if (!ok) throw StoreError("redis: EXISTS " + k + " failed: " + why);
            }
            if (exists > 0) {
                next++;
                continue;
            }
            sleepOrThrow(deadline, backoff, "key " + k + " (" + std::to_string(keys.size() - next) +
                                               " of " + std::to_string(keys.size()) + " keys missing)");
        }
    }

  private:
    std::string full(const std::string &key) const { return prefix_ + "/" + key; }

    // The rendezvous ends early when the abort key appears (the job closed this epoch: a
    // peer will never come, or has already left). Checked on every store access, so a late
    // arrival does not go on to connect to peers that are gone.
    void throwIfAborted() {
        if (abortKey_.empty()) return;
        std::lock_guard<std::mutex> lock(m_);
        redisReply *r = command({"EXISTS", abortKey_});
        bool aborted = r->type == REDIS_REPLY_INTEGER && r->integer > 0;
        freeReplyObject(r);
        if (aborted) throw StoreError("rendezvous aborted: " + abortKey_ + " is set");
    }

    void sleepOrThrow(Clock::time_point deadline, milliseconds &backoff, const std::string &what) {
        throwIfAborted();
        Clock::time_point now = Clock::now();
        if (now >= deadline)
            throw StoreTimeout("rendezvous: Timed out waiting for " + what + " in the Redis store");
        milliseconds left = std::chrono::duration_cast<milliseconds>(deadline - now) + milliseconds(1);
        std::this_thread::sleep_for(std::min(backoff, left));
        backoff = std::min(backoff * 2, milliseconds(10));
    }

    // Runs one command given as argv (binary-safe); an optional leading verb is prepended.
    // Returns a non-NULL reply (caller frees) or throws StoreError on a connection failure.
    redisReply *command(const std::vector<std::string> &args, const char *verb = nullptr) {
        if (ctx_ == nullptr) throw StoreError("redis: not connected");
        std::vector<const char *> argv;
        std::vector<size_t> lens;
        if (verb != nullptr) {
            argv.push_back(verb);
            lens.push_back(strlen(verb));
        }
        for (const std::string &a : args) {
            argv.push_back(a.data());
            lens.push_back(a.size());
        }
        void *raw = redisCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data());
        if (raw == nullptr) {
            std::string msg = std::string("redis: connection failed: ") + (ctx_->err ? ctx_->errstr : "no reply");
            redisFree(ctx_); // a context in error state is unusable
            ctx_ = nullptr;
            throw StoreError(msg);
        }
        return static_cast<redisReply *>(raw);
    }

    redisContext *ctx_ = nullptr;
    std::mutex m_;
    const std::string prefix_;
    const milliseconds timeout_;
    const std::string abortKey_;
    long long ttl_s_ = 3600;
};

// Element-wise float sum for the ring: c = a + b. Fixed operand order, so the result depends
// only on the ring topology, never on timing. (gloo::sum<float> loops with an int counter.)
void sumFloat(void *c_, const void *a_, const void *b_, size_t n) {
    float *c = static_cast<float *>(c_);
    const float *a = static_cast<const float *>(a_);
    const float *b = static_cast<const float *>(b_);
    for (size_t i = 0; i < n; i++) c[i] = a[i] + b[i];
}

std::string lower(std::string s) {
    for (char &ch : s) ch = static_cast<char>((ch >= 'A' && ch <= 'Z') ? ch - 'A' + 'a' : ch);
    return s;
}

bool contains(const std::string &hay, const char *needle) { return hay.find(needle) != std::string::npos; }

comm_status classifyMessage(const std::string &msg) {
    std::string m = lower(msg);
    static const char *const peer[] = {"connection closed", "closed by peer", "socket closed", "unexpectedly closed",
                                       "connection reset", "reset by peer", "broken pipe", "end of file", "unexpected eof",
                                       "econnreset", "epipe", "connection refused", "no route to host"};
    for (const char *p : peer)
        if (contains(m, p)) return COMM_ERR_PEER;
    if (contains(m, "timed out") || contains(m, "timeout")) return COMM_ERR_TIMEOUT;
    if (contains(m, "redis") || contains(m, "store")) return COMM_ERR_STORE;
    return COMM_ERR_INTERNAL;
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
    } catch (const gloo::IoException &e) {
        msg = e.what();
        comm_status s = classifyMessage(msg);
        return s == COMM_ERR_INTERNAL ? COMM_ERR_PEER : s; // an I/O failure is a peer problem
    } catch (const gloo::EnforceNotMet &e) {
        msg = e.what();
        return classifyMessage(msg);
    } catch (const std::bad_alloc &) {
        msg = "out of memory";
        return COMM_ERR_INTERNAL;
    } catch (const std::exception &e) {
        msg = e.what();
        return classifyMessage(msg);
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
    std::shared_ptr<gloo::transport::Device> dev;
    std::shared_ptr<gloo::rendezvous::Context> ctx; // null when size == 1
    comm_status broken = COMM_OK;
    std::string last_error;
};

namespace {

milliseconds callTimeout(const comm *c, int timeout_ms) {
    return milliseconds(timeout_ms > 0 ? timeout_ms : c->timeout_ms);
}

// Common prologue/epilogue of every collective: refuse on a broken communicator, run the body
// under guarded(), and on failure mark the communicator broken and drop all connections so the
// peers fail fast too.
template <typename Fn>
comm_status runCollective(comm *c, Fn &&body) {
    if (c->broken != COMM_OK) return c->broken;
    std::string msg;
    comm_status s = guarded(body, msg);
    if (s != COMM_OK) {
        c->broken = s;
        c->last_error = msg;
        if (c->ctx) {
            std::string ignored;
            guarded([&] { c->ctx->closeConnections(); }, ignored);
        }
    }
    return s;
}

} // namespace

extern "C" {

comm_t *comm_create(const comm_store_addr *store, const char *prefix, int rank, int size, const char *bind_host,
                    int timeout_ms, char *err, size_t errlen) {
    writeErr(err, errlen, "");
    if (store == nullptr || store->host == nullptr || prefix == nullptr || prefix[0] == '\0' || size < 1 ||
        rank < 0 || rank >= size || timeout_ms <= 0 || store->port <= 0 || store->port > 65535) {
        writeErr(err, errlen, "comm_create: invalid arguments");
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
                RedisAuthStore rs(store->host, store->port, store->password, prefix, t, store->abort_key);
                gloo::transport::tcp::attr attr;
                attr.hostname = (bind_host != nullptr && bind_host[0] != '\0') ? bind_host : "127.0.0.1";
                cc->dev = gloo::transport::tcp::CreateDevice(attr);
                cc->ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
                cc->ctx->setTimeout(t);
                cc->ctx->connectFullMesh(rs, cc->dev);
            }
            c = cc.release();
        },
        msg);
    if (s != COMM_OK) {
        writeErr(err, errlen, std::string("comm_create (") + comm_status_str(s) + "): " + msg);
        return nullptr;
    }
    return c;
}

void comm_destroy(comm_t *c) {
    if (c == nullptr) return;
    std::string ignored;
    guarded(
        [&] {
            if (c->ctx) {
                c->ctx->closeConnections();
                c->ctx.reset();
            }
            c->dev.reset();
        },
        ignored);
    try {
        delete c;
    } catch (...) {
    }
}

int comm_rank(const comm_t *c) { return c ? c->rank : -1; }
int comm_size(const comm_t *c) { return c ? c->size : 0; }

comm_status comm_allreduce_sum(comm_t *c, float *buf, size_t n, int timeout_ms) {
    if (c == nullptr || (buf == nullptr && n > 0) || n > SIZE_MAX / sizeof(float)) return COMM_ERR_INVALID;
    if (c->broken != COMM_OK) return c->broken;
    if (n == 0 || c->size == 1) return COMM_OK;
    return runCollective(c, [&] {
        gloo::AllreduceOptions opts(c->ctx);
        opts.setOutput(buf, n);
        opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
        opts.setReduceFunction(sumFloat);
        opts.setTag(c->tag++);
        opts.setTimeout(callTimeout(c, timeout_ms));
        gloo::allreduce(opts);
    });
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
        opts.setOutput(out, n * static_cast<size_t>(c->size));
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
        opts.setOutput(static_cast<uint8_t *>(buf), nbytes);
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
        gloo::BarrierOptions opts(c->ctx);
        opts.setTag(c->tag++);
        opts.setTimeout(callTimeout(c, timeout_ms));
        gloo::barrier(opts);
    });
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
