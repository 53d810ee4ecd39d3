/* jfield.c — JSON values described for error messages (see jfield.h). */
#include "jfield.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *jfield_type(const json_t *v)
{
    if (!v)
        return "missing";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

const char *jfield_desc(const json_t *v, char *buf, size_t n)
{
    if (!v)
        return "missing";
    if (json_is_array(v))
        return "an array";
    if (json_is_object(v))
        return "an object";
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!s)
        return "?";
    if (strlen(s) < n)
        snprintf(buf, n, "%s", s);
    else
        snprintf(buf, n, "%.*s...", (int)(n - 4), s);
    free(s);
    return buf;
}
