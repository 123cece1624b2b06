/* cli.h - the daemon's command-line flags: the spellings llama-server users type.
 *
 * Each value flag overrides one config key (docs/CONFIG.md). A llama-server flag that tide
 * does not have, and any other unknown flag, stops start-up with one line naming it: a flag
 * silently ignored is a server that runs differently from what its operator asked. */
#ifndef TIDE_CLI_H
#define TIDE_CLI_H

#include "server/config.h"

/* First pass, before the config file is read: finds --config, --help, --version and rejects
 * unknown or unsupported flags and missing values. */
int cli_scan(int argc, char **argv, const char **config_file, bool *help, bool *version, char *err,
             size_t errlen);
/* Second pass, after the file: each flag's value overrides its key in c. */
int cli_apply(struct config *c, int argc, char **argv, char *err, size_t errlen);
/* The --help text. */
const char *cli_usage(void);

#endif
