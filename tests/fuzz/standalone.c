/*
 * standalone.c — runs a libFuzzer harness over every file of a corpus directory without
 * libFuzzer, so the corpus (seeds and past crashers) is a regression test in every build.
 * Prints the plain closing line "N passed, 0 failed"; a crash is the failure.
 */
#include "fuzz.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (!buf || (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n)) {
        fclose(f);
        free(buf);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int count = 0;
    for (int i = 1; i < argc; i++) {
        DIR *d = opendir(argv[i]);
        if (!d) {
            if (run_file(argv[i]) != 0)
                return 1;
            count++;
            continue;
        }
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.')
                continue;
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[i], e->d_name);
            struct stat st;
            if (stat(p, &st) != 0 || !S_ISREG(st.st_mode))
                continue;
            if (run_file(p) != 0) {
                closedir(d);
                return 1;
            }
            count++;
        }
        closedir(d);
    }
    if (count == 0) {
        fprintf(stderr, "no corpus inputs found: a harness without seeds tests nothing\n");
        return 1;
    }
    printf("%d passed, 0 failed\n", count);
    return 0;
}
