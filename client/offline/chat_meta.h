/*
 * chat_meta.h — the chat metadata a conversion carries into the model directory beside the
 * IEBIN: the model's Jinja2 chat template and its generation defaults, as chat.ie.json
 * (docs/CHAT.md "chat.ie.json"). The worker reads it (worker/process/chat.c) to render chats
 * the way the model was trained to see them.
 */
#ifndef CLOCHER_CLIENT_OFFLINE_CHAT_META_H
#define CLOCHER_CLIENT_OFFLINE_CHAT_META_H

#ifndef CHAT_META_FILE /* the same name in worker/process/chat.h and client/offline/chat_meta.h */
#define CHAT_META_FILE "chat.ie.json"
#endif

/*
 * Writes <out_dir>/chat.ie.json from the conversion source src:
 *  - a Hugging Face folder: chat_template.jinja, else chat_template.json, else
 *    tokenizer_config.json's chat_template (a string, or a list of {name, template} whose
 *    "default" is taken); generation_config.json's eos_token_id (an int or a list), bos_token_id,
 *    temperature, top_p, top_k, repetition_penalty;
 *  - a .gguf file: tokenizer.chat_template, tokenizer.ggml.eos_token_id / bos_token_id;
 *  - a model directory that already has chat.ie.json (re-quantization): copied.
 * Nothing to carry: no file, 0. A template the interpreter would refuse is still carried (a
 * later Clocher may render it) and a warning names the construct. 0, or a negative code logged
 * once naming the file and field (a chat_template that is not a string, malformed JSON).
 */
int chat_meta_write(const char *src, const char *out_dir);

#endif
