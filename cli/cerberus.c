/*
 * cerberus.c — main() of the `cerberus` command. Everything else is in the
 * other files of cli/ (an object library), so that tests can link the
 * command's parsers without a second main() (main.c says how it is split).
 */
#include "cli.h"

int main(int argc, char **argv)
{
    return cerb__cli_main(argc, argv);
}
