/* Shared helpers of the tllm front ends. Only the CLI exits the process. */
#ifndef TLLM_CLI_H
#define TLLM_CLI_H

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

/* Print "tllm: <message>" to stderr and exit(1). */
void cli_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* Die with the library's last error message. */
void cli_die_lib(void) __attribute__((noreturn));

/* Parse an integer flag value in [lo, hi] or die naming the flag. */
long cli_int(const char *flag, const char *s, long lo, long hi);
double cli_double(const char *flag, const char *s, double lo, double hi);
/* The value after flag argv[*i] (advancing *i), or die. */
const char *cli_value(int argc, char **argv, int *i);

/* -t N as the thread pool will run it: at most the CPUs this process may use (more threads would only
 * wait for each other), with a line on stderr when it is lowered. */
int cli_threads(int n);

/* Parse "1,2,3" into a heap array of ids; dies on a malformed list. */
int32_t *cli_parse_ids(const char *flag, const char *s, int *n);

/* Write a whole buffer to `path`: a regular file atomically (temp file + rename, so a failure leaves
 * the old content, never a part of the new), through symlinks to where they point, and to a device or
 * a FIFO directly (never replacing it). 0, or -1 with the reason in err. */
int cli_write_file(const char *path, const void *data, size_t n, char *err, size_t cap);
/* The same, dying on failure. */
void cli_write_file_atomic(const char *path, const void *data, size_t n);

/* The model directory for -m `arg` (NULL when not given): a directory as is, a Hugging Face repo id
 * ("owner/name[@rev]") from the local hub cache, else $TLLM_MODEL, else the bundled demo model (said
 * on stderr). Dies when a repo id is not in the cache. The result lives until the next call. */
const char *cli_model_dir(const char *arg);

/* The next line of fp into *buf, without its newline; -1 at EOF. A line of max bytes or more (its
 * newline counted) is not kept (*too_long = 1, length 0): it is read to its end, or with stop_long
 * (a stream that may never end one: /dev/zero) reading stops where it went over. *ended (may be
 * NULL): a newline ended the line (0: the file ended first, a torn last line). */
ssize_t cli_getline(char **buf, size_t *cap, FILE *fp, size_t max, int stop_long, int *too_long, int *ended);

/* The model directory's tokenizer.json, or die. */
struct tllm_tok *cli_load_tokenizer(const char *dir);
/* The chat template of the model at dir (without its weights; none when dir is NULL or no_template), or
 * the template file `file` (when not NULL) with the model's special tokens. Dies on error. */
struct tllm_chat_template;
void cli_load_template(const char *dir, const char *file, int no_template, struct tllm_chat_template *tpl);
/* A conversation file: an array of messages, or an object with "messages", "tools" (*tools, or NULL) and
 * other variables (*extra, a new object, or NULL). *root holds them all. Dies on error. */
struct json_object;
void cli_read_conversation(const char *path, struct json_object **root, struct json_object **messages,
                           struct json_object **tools, struct json_object **extra);

int cmd_logits(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_matvec(int argc, char **argv);
int cmd_bench_gemm(int argc, char **argv);
int cmd_devices(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);

#endif
