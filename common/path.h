/*
 * path.h — file-system path helpers shared by the model loaders, writers and offline tools:
 * joining a directory and a file name, creating a directory with its missing parents, and
 * removing a scratch tree.
 */
#ifndef CLOCHER_COMMON_PATH_H
#define CLOCHER_COMMON_PATH_H

/*
 * "dir/name" in a new malloc'd string (the caller frees it). NULL only when out of memory;
 * it does not log, because callers usually build several paths and report one "out of
 * memory" naming the object they were opening. No normalisation: "a/" + "b" gives "a//b",
 * which the kernel reads as "a/b".
 */
char *path_join(const char *dir, const char *name);

/*
 * mkdir -p: creates `dir` and each missing parent with mode 0755; an existing directory is
 * fine. 0, -ENOTDIR when `dir` (or a parent) exists but is not a directory, -EINVAL for an
 * empty path, or -errno of the failing mkdir/stat; logged once at the failing step.
 */
int path_mkdir_p(const char *dir);

/*
 * rm -rf for scratch trees: removes `dir` and everything under it, without following
 * symlinks; a missing `dir` is fine. Best effort: a tree that cannot be removed whole is named
 * in a warning (a leftover scratch folder must not fail the job that made it).
 */
void path_rm_tree(const char *dir);

#endif
