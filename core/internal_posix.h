/*
 * internal_posix.h — feature-test macros, included first by every .c that
 * needs POSIX under -std=c11 (CLOCK_MONOTONIC, pthread_condattr_setclock,
 * flock). The build also defines them per target; this keeps a file correct
 * when compiled on its own.
 */
#ifndef CERB_INTERNAL_POSIX_H
#define CERB_INTERNAL_POSIX_H
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE 1
#endif
#endif
