/*
 * err.h — Clocher's error codes.
 *
 * Fallible functions return 0 on success or a negative code: either -errno (a system call's
 * own reason) or one of the project codes below, which sit far below any errno value. The
 * table is an X-macro so the enum, err_str() and err_name() can never drift apart.
 */
#ifndef CLOCHER_COMMON_ERR_H
#define CLOCHER_COMMON_ERR_H

#define ERR_TABLE(X)                                                                  \
    X(ERR_FORMAT, -10001, "malformed input")                                          \
    X(ERR_UNSUPPORTED, -10002, "unsupported feature or version")                      \
    X(ERR_RANGE, -10003, "value out of range")                                        \
    X(ERR_NOT_FOUND, -10004, "not found")                                             \
    X(ERR_OVERFLOW, -10005, "arithmetic overflow")                                    \
    X(ERR_TRUNCATED, -10006, "truncated input")                                       \
    X(ERR_MISMATCH, -10007, "mismatch")                                               \
    X(ERR_OVERLOADED, -10008, "overloaded")                                           \
    X(ERR_CANCELLED, -10009, "cancelled")                                             \
    X(ERR_DEADLINE, -10010, "deadline exceeded")                                      \
    X(ERR_STATE, -10011, "invalid state")                                             \
    X(ERR_QUALITY, -10012, "quality gate failed")                                     \
    X(ERR_USAGE, -10013, "invalid usage")

enum err_code {
#define ERR_ENUM_(name, value, text) name = value,
    ERR_TABLE(ERR_ENUM_)
#undef ERR_ENUM_
};

/* Human text for any return code: project codes, -errno values and 0 ("ok"). Never NULL. */
const char *err_str(int code);

/* Symbolic name ("ERR_FORMAT", "ENOENT", ...) for logs and tests. Never NULL. */
const char *err_name(int code);

#endif
