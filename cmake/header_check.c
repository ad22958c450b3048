/* Compiled alone to prove include/cerberus.h is self-contained. */
#include "cerberus.h"
