/*
 * cmd_chat.h — `clocher chat` (cmd_chat.c). Its own header until client/cmds.h lists it
 * with the other commands; `clocher generate --chat ...` reaches it meanwhile.
 */
#ifndef CLOCHER_CLIENT_CMD_CHAT_H
#define CLOCHER_CLIENT_CMD_CHAT_H

int cmd_chat(int argc, char **argv);

#endif
