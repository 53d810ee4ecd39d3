/*
 * cmds.h — the `clocher` subcommands. Each takes the arguments after its own name
 * (argv[0] is the subcommand name) and returns the process exit code:
 * 0 ok, 1 failure, 2 usage error, 3 input model/file missing or invalid, 4 a quality gate
 * refused the result (`convert --gate-*`: nothing was written), and for the online commands
 * 5 clocherd could not be reached (nothing listening at the address, TLS handshake failed,
 * no connection within --connect-timeout) and 6 the daemon answered with a gRPC error status
 * (refused or failed the call: UNAUTHENTICATED, INVALID_ARGUMENT, UNAVAILABLE, ...; the status
 * and its message are printed). docs/CLIENT.md lists each command's codes.
 */
#ifndef CLOCHER_CLIENT_CMDS_H
#define CLOCHER_CLIENT_CMDS_H

#define CMD_EXIT_OK 0
#define CMD_EXIT_FAIL 1
#define CMD_EXIT_USAGE 2
#define CMD_EXIT_INPUT 3
#define CMD_EXIT_QUALITY 4
#define CMD_EXIT_UNREACHABLE 5
#define CMD_EXIT_REFUSED 6


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
int cmd_sparsify(int argc, char **argv);

/* Online commands: gRPC to clocherd (client/online/rpc.h). */
int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_batch(int argc, char **argv);
int cmd_adapters(int argc, char **argv);
int cmd_health(int argc, char **argv);
int cmd_metrics(int argc, char **argv);
int cmd_bench(int argc, char **argv);
#endif
