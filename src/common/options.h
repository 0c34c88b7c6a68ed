/* options.h — typed option tables: one table per owner (the job's options in src/job/config.c,
 * the GPT-2 trainer's in gpt2/options.c), each option described once with its type, range
 * and help. The same table parses the command line, checks values, serialises a struct to
 * "name=value" lines (what the job keeps in Redis and in checkpoints) and prints --help. */
#ifndef DEADPOOL_OPTIONS_H
#define DEADPOOL_OPTIONS_H

#include <stddef.h>

/* LIST: repeated flags append ','; ENUM: one of `choices`, stored as its index (int). */
typedef enum { OPT_INT, OPT_U64, OPT_FLOAT, OPT_STR, OPT_LIST, OPT_ENUM } OptType;

typedef struct {
    const char *name;
    OptType type;
    size_t offset;   /* of the field in the struct */
    size_t cap;      /* OPT_STR / OPT_LIST: size of the char array */
    double min, max; /* numeric range, inclusive; floats must also be finite */
    const char *const *choices; /* OPT_ENUM: NULL-terminated names */
    const char *help;
} OptSpec;

typedef struct {
    const OptSpec *opts;
    size_t n;
} OptTable;

/* The spec named `name`, NULL if the table has none. */
const OptSpec *opt_find(OptTable t, const char *name);
/* Sets option `name` of the struct at base from its text. 0, or -1 with err naming the option,
 * the expected and the found value. */
int opt_set(OptTable t, void *base, const char *name, const char *value, char *err, size_t errlen);
/* One option's value as text. */
int opt_format(const OptSpec *o, const void *base, char *buf, size_t len);
/* "name=value\n" for every option. 0 / -1 (buffer too small). */
int opt_serialize(OptTable t, const void *base, char *buf, size_t len);
/* Reads "name=value" lines into base (which holds the defaults already). Lines naming an
 * option of another table are skipped when skip_unknown. 0 / -1 + err. */
int opt_parse_lines(OptTable t, void *base, const char *text, int skip_unknown, char *err, size_t errlen);
/* "  --name  help [default]" for every option, defaults taken from base. */
void opt_print_help(OptTable t, const void *base);

#endif
