/* err.c — text for Clocher's error codes (see err.h). */
#include "err.h"

#include <string.h>

const char *err_str(int code)
{
    if (code == 0)
        return "ok";
    switch (code) {
#define ERR_STR_(name, value, text) \
    case name:                      \
        return text;
        ERR_TABLE(ERR_STR_)
#undef ERR_STR_
    default:
        break;
    }
    if (code < 0 && code > -4096)
        return strerror(-code);
    return "unknown error";
}

const char *err_name(int code)
{
    if (code == 0)
        return "OK";
    switch (code) {
#define ERR_NAME_(name, value, text) \
    case name:                       \
        return #name;
        ERR_TABLE(ERR_NAME_)
#undef ERR_NAME_
    default:
        break;
    }
    if (code < 0 && code > -4096) {
        const char *n = strerrorname_np(-code);
        return n ? n : "EUNKNOWN";
    }
    return "EUNKNOWN";
}
