/* redis_url.c — the control plane's URLs: redis://, unix:// and redis-sentinel:// parsed
 * into a redis_addr (the password from the URL or DEADPOOL_REDIS_PASSWORD), formatted back
 * with the password redacted or scrubbed in place, and the 0600 file that holds one with its
 * password (--redis-file). */
#include "control.h"
#include "control_internal.h"
#include "protocol.h"
#include "redis_connect.h"
#include "secret.h"
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>
#include <time.h>
#include <arpa/inet.h>
#include <sys/socket.h>

/* A URL's port (stored values are parsed by protocol.h's proto_int_parse: ctl_reply_int). */
static int parse_long(const char *s, size_t n, long *out) {
    char buf[32];
    if (n == 0 || n >= sizeof buf) return -1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    char *end = NULL;
    errno = 0;
    long v = strtol(buf, &end, 10);
    if (errno != 0 || *end != '\0') return -1;
    *out = v;
    return 0;
}

/* ------------------------------------------------------------------------------------- */
/* URL parsing                                                                            */
/* ------------------------------------------------------------------------------------- */

/* The URL as it may appear in messages: the password part replaced by "***". */
static void redact_url(const char *url, char *out, size_t outlen) {
    const char *scheme_end = strstr(url, "://");
    const char *auth = scheme_end ? scheme_end + 3 : url;
    const char *at = strrchr(auth, '@');
    if (!at) {
        snprintf(out, outlen, "%s", url);
        return;
    }
    snprintf(out, outlen, "%.*s***%s", (int)(auth - url), url, at);
}

static int hex_value(int ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* Percent-decodes src[0..n) into dst so passwords may contain '@', '/' or ':'.
 * 0, or -1 on a malformed escape / overflow. */
static int percent_decode(const char *src, size_t n, char *dst, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int ch = (unsigned char)src[i];
        if (ch == '%') {
            if (i + 2 >= n) return -1; /* needs two hex digits */
            int hi = hex_value((unsigned char)src[i + 1]);
            int lo = hex_value((unsigned char)src[i + 2]);
            if (hi < 0 || lo < 0) return -1;
            ch = hi * 16 + lo;
            i += 2;
        }
        if (ch == 0 || o + 1 >= cap) return -1;
        dst[o++] = (char)ch;
    }
    dst[o] = '\0';
    return 0;
}

/* Parses the "user:password" part of the URL (without the '@'). Only an empty user is
 * accepted because redis_addr has no user name. Messages never include the password. */
static int parse_userinfo(const char *ui, size_t n, const char *shown, redis_addr *out,
                          char *err, size_t errlen) {
    const char *colon = memchr(ui, ':', n);
    if (!colon) {
        set_err(err, errlen, "redis URL '%s': credentials must be written ':PASSWORD@'", shown);
        return -1;
    }
    if (colon != ui) {
        set_err(err, errlen, "redis URL '%s': user names are not supported, write ':PASSWORD@'", shown);
        return -1;
    }
    const char *pw = colon + 1;
    size_t pwlen = n - (size_t)(pw - ui);
    if (pwlen == 0) {
        set_err(err, errlen, "redis URL '%s': empty password", shown);
        return -1;
    }
    if (percent_decode(pw, pwlen, out->password, sizeof out->password) != 0) {
        set_err(err, errlen, "redis URL '%s': password is too long or has a bad %%-escape", shown);
        return -1;
    }
    return 0;
}

/* Parses "HOST:PORT" or "[IPV6]:PORT" (hostport[0..n)) into out->host / out->port. */
static int parse_hostport(const char *hp, size_t n, const char *shown, redis_addr *out,
                          char *err, size_t errlen) {
    const char *host = hp, *host_end, *rest;
    if (n > 0 && hp[0] == '[') { /* bracketed IPv6 literal */
        const char *close = memchr(hp, ']', n);
        if (!close) {
            set_err(err, errlen, "redis URL '%s': unterminated '[' in host", shown);
            return -1;
        }
        host = hp + 1;
        host_end = close;
        rest = close + 1;
    } else {
        /* The last ':' starts the port, so an unbracketed IPv6 literal ("::1:6379", as
         * "redis://%s:%d" would print it) still parses. */
        host_end = memrchr(hp, ':', n);
        if (!host_end) host_end = hp + n;
        rest = host_end;
    }
    size_t hostlen = (size_t)(host_end - host);
    if (hostlen == 0) {
        set_err(err, errlen, "redis URL '%s': missing host", shown);
        return -1;
    }
    if (copy_checked(out->host, sizeof out->host, host, hostlen) != 0) {
        set_err(err, errlen, "redis URL '%s': host name is too long", shown);
        return -1;
    }
    const char *end = hp + n;
    if (rest >= end || *rest != ':' || rest + 1 == end) {
        set_err(err, errlen, "redis URL '%s': missing port", shown);
        return -1;
    }
    const char *port = rest + 1;
    long p = 0;
    for (const char *q = port; q < end; q++) {
        if (!isdigit((unsigned char)*q)) {
            set_err(err, errlen, "redis URL '%s': port must be a number", shown);
            return -1;
        }
    }
    if (parse_long(port, (size_t)(end - port), &p) != 0 || p < 1 || p > 65535) {
        set_err(err, errlen, "redis URL '%s': port must be between 1 and 65535", shown);
        return -1;
    }
    out->port = (int)p;
    return 0;
}

/* Fills out->password from DEADPOOL_REDIS_PASSWORD when the URL carried none. */
static int password_from_env(redis_addr *out, char *err, size_t errlen) {
    const char *env = getenv("DEADPOOL_REDIS_PASSWORD");
    if (!env || !*env) return 0;
    if (copy_checked(out->password, sizeof out->password, env, strlen(env)) != 0) {
        set_err(err, errlen, "DEADPOOL_REDIS_PASSWORD is too long (at most %zu bytes)",
                sizeof out->password - 1);
        return -1;
    }
    return 0;
}

/* "[:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER" after "redis-sentinel://". */
static int parse_sentinel_url(const char *p, const char *shown, redis_addr *out, char *err, size_t errlen) {
    const char *at = strrchr(p, '@');
    const char *hp = p;
    if (at) {
        if (parse_userinfo(p, (size_t)(at - p), shown, out, err, errlen) != 0) goto fail;
        hp = at + 1;
    }
    const char *slash = strchr(hp, '/');
    if (!slash || !slash[1] || strchr(slash + 1, '/')) {
        set_err(err, errlen, "redis URL '%s': expected /MASTER (the name the sentinels monitor) after the sentinels", shown);
        goto fail;
    }
    if (copy_checked(out->master, sizeof out->master, slash + 1, strlen(slash + 1)) != 0) {
        set_err(err, errlen, "redis URL '%s': master name is too long", shown);
        goto fail;
    }
    for (const char *h = hp; h < slash;) {
        const char *comma = memchr(h, ',', (size_t)(slash - h));
        const char *end = comma ? comma : slash;
        if (out->nsentinels == REDIS_SENTINELS_MAX) {
            set_err(err, errlen, "redis URL '%s': at most %d sentinels", shown, REDIS_SENTINELS_MAX);
            goto fail;
        }
        if (parse_hostport(h, (size_t)(end - h), shown, out, err, errlen) != 0) goto fail;
        memcpy(out->sentinel_host[out->nsentinels], out->host, sizeof out->host);
        out->sentinel_port[out->nsentinels++] = out->port;
        h = comma ? comma + 1 : slash;
    }
    if (out->nsentinels == 0) {
        set_err(err, errlen, "redis URL '%s': no sentinel given", shown);
        goto fail;
    }
    if (out->password[0] == '\0' && password_from_env(out, err, errlen) != 0) goto fail;
    return 0;
fail:
    memset(out->password, 0, sizeof out->password);
    return -1;
}

void redis_addr_format(const redis_addr *a, char *buf, size_t len) {
    if (a->nsentinels == 0 && a->host[0] == '/') {
        snprintf(buf, len, "unix://%s", a->host);
        return;
    }
    if (a->nsentinels == 0) {
        int v6 = strchr(a->host, ':') != NULL;
        snprintf(buf, len, "redis://%s%s%s:%d", v6 ? "[" : "", a->host, v6 ? "]" : "", a->port);
        return;
    }
    size_t used = (size_t)snprintf(buf, len, "redis-sentinel://");
    for (int i = 0; i < a->nsentinels && used < len; i++) {
        int v6 = strchr(a->sentinel_host[i], ':') != NULL;
        used += (size_t)snprintf(buf + used, len - used, "%s%s%s%s:%d", i ? "," : "", v6 ? "[" : "", a->sentinel_host[i],
                                 v6 ? "]" : "", a->sentinel_port[i]);
    }
    if (used < len) snprintf(buf + used, len - used, "/%s", a->master);
}

/* "[:PASSWORD@]/PATH" after "unix://": a Redis that listens on a unix socket (the embedded one
 * of a one-machine job). The path is kept in out->host (a host never starts with '/'), port 0. */
static int parse_unix_url(const char *p, const char *shown, redis_addr *out, char *err, size_t errlen) {
    const char *at = strrchr(p, '@');
    const char *path = p;
    if (at) {
        if (parse_userinfo(p, (size_t)(at - p), shown, out, err, errlen) != 0) goto fail;
        path = at + 1;
    }
    if (path[0] != '/' || path[1] == 0) {
        set_err(err, errlen, "redis URL '%s': expected unix:///PATH (an absolute path to the socket)", shown);
        goto fail;
    }
    if (strlen(path) >= REDIS_UNIX_PATH_MAX) {
        set_err(err, errlen, "redis URL '%s': socket path is longer than %d bytes", shown, REDIS_UNIX_PATH_MAX - 1);
        goto fail;
    }
    snprintf(out->host, sizeof out->host, "%s", path);
    out->port = 0;
    if (out->password[0] == '\0' && password_from_env(out, err, errlen) != 0) goto fail;
    return 0;
fail:
    memset(out->password, 0, sizeof out->password);
    return -1;
}

int redis_addr_parse(const char *url, redis_addr *out, char *err, size_t errlen) {
    if (!url || !out) {
        set_err(err, errlen, "redis URL: missing");
        return -1;
    }
    memset(out, 0, sizeof *out);
    char shown[600];
    redact_url(url, shown, sizeof shown);

    const char *p = url;
    const char *scheme_end = strstr(url, "://");
    int sentinel = 0;
    if (scheme_end) {
        sentinel = (size_t)(scheme_end - url) == 14 && strncmp(url, "redis-sentinel", 14) == 0;
        if ((size_t)(scheme_end - url) == 4 && strncmp(url, "unix", 4) == 0)
            return parse_unix_url(scheme_end + 3, shown, out, err, errlen);
        if (!sentinel && ((size_t)(scheme_end - url) != 5 || strncmp(url, "redis", 5) != 0)) {
            set_err(err, errlen, "redis URL '%s': unsupported scheme (expected redis://, redis-sentinel:// or unix://)", shown);
            return -1;
        }
        p = scheme_end + 3;
    }
    if (sentinel) return parse_sentinel_url(p, shown, out, err, errlen);
    size_t n = strlen(p);
    if (n > 0 && p[n - 1] == '/') n--; /* trailing "/" allowed */

    /* The last '@' separates credentials from the host, so an unescaped '@' in the password
     * still parses; a '/' before the host would otherwise be taken for a path. */
    const char *at = NULL;
    for (size_t i = 0; i < n; i++)
        if (p[i] == '@') at = p + i;
    const char *hp = p;
    if (at) {
        if (parse_userinfo(p, (size_t)(at - p), shown, out, err, errlen) != 0) goto fail;
        hp = at + 1;
    }
    size_t hplen = n - (size_t)(hp - p);
    if (memchr(hp, '/', hplen)) {
        set_err(err, errlen, "redis URL '%s': unexpected path after the port (database numbers are not supported)", shown);
        goto fail;
    }
    if (hplen == 0) {
        set_err(err, errlen, "redis URL '%s': missing host", shown);
        goto fail;
    }
    if (parse_hostport(hp, hplen, shown, out, err, errlen) != 0) goto fail;
    if (out->password[0] == '\0' && password_from_env(out, err, errlen) != 0) goto fail;
    return 0;
fail:
    memset(out->password, 0, sizeof out->password); /* do not leave a half-parsed secret */
    return -1;
}

/* ------------------------------------------------------------------------------------- */
/* a URL with its password in a file                                                      */
/* ------------------------------------------------------------------------------------- */

/* The URL of addr with ":PASSWORD@" (percent-encoded but for unreserved characters). */
static int format_with_password(const redis_addr *a, char *buf, size_t len) {
    char plain[4200], pw[3 * sizeof a->password + 1];
    redis_addr_format(a, plain, sizeof plain);
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)a->password; *p && o + 4 < sizeof pw; p++) {
        if (isalnum(*p) || *p == '-' || *p == '.' || *p == '_' || *p == '~') pw[o++] = (char)*p;
        else o += (size_t)snprintf(pw + o, sizeof pw - o, "%%%02X", *p);
    }
    pw[o] = 0;
    const char *rest = strstr(plain, "://");
    if (!rest) return -1;
    rest += 3;
    int n = a->password[0] ? snprintf(buf, len, "%.*s:%s@%s", (int)(rest - plain), plain, pw, rest)
                           : snprintf(buf, len, "%s", plain);
    explicit_bzero(pw, sizeof pw);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

int redis_file_write(const redis_addr *addr, const char *dir, char *path, size_t len, char *err, size_t errlen) {
    char url[5000];
    if (format_with_password(addr, url, sizeof url) != 0) {
        set_err(err, errlen, "redis file: the URL is too long");
        return -1;
    }
    int n = snprintf(path, len, "%s/redis", dir);
    int rc = n > 0 && (size_t)n < len ? private_line_write(path, url, err, errlen) : -1;
    explicit_bzero(url, sizeof url);
    return rc;
}

int redis_file_read(const char *path, char *url, size_t len, char *err, size_t errlen) {
    return private_line_read(path, "a redis URL", url, len, err, errlen);
}

int redis_url_scrub(char *url) {
    char *scheme_end = strstr(url, "://");
    char *auth = scheme_end ? scheme_end + 3 : url;
    char *at = strrchr(auth, '@');
    char *colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
    if (!colon || colon + 1 == at) return 0;
    memset(colon + 1, '*', (size_t)(at - colon - 1));
    return 1;
}
