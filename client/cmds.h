/*
 * cmds.h — the `clocher` subcommands. Each takes the arguments after its own name
 * (argv[0] is the subcommand name) and returns the process exit code:
 * 0 ok, 1 failure, 2 usage error, 3 input model/file missing or invalid, 4 a quality gate
 * refused the result (`convert --gate-*`: nothing was written).
 */
#ifndef CLOCHER_CLIENT_CMDS_H
#define CLOCHER_CLIENT_CMDS_H

#define CMD_EXIT_OK 0
#define CMD_EXIT_FAIL 1
#define CMD_EXIT_USAGE 2
#define CMD_EXIT_INPUT 3
#define CMD_EXIT_QUALITY 4



/* One entry per subcommand, in client/main.c's table. */
struct cmd {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
};

/* Offline tools (link the model library). */
int cmd_convert(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_synth_adapter(int argc, char **argv);
#endif
