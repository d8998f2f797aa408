/*
** gemm_fixture.h -- what the GEMM provider fixture (gemm_fixture.c) exports beside its entry
** point, so that test_gemm_providers can count its calls and steer its run(): the test finds the
** symbol GEMM_FIXTURE_STATE in the loaded module (dlopen of the same file, dlsym).
*/
#ifndef GEMM_FIXTURE_H
#define GEMM_FIXTURE_H

#define GEMM_FIXTURE_STATE "gemm_fixture"

/* gemm_fixture_state.mode */
#define GEMM_FIXTURE_RUN 0     /* run() computes the product */
#define GEMM_FIXTURE_DECLINE 1 /* run() declines every problem (HQ_ENOTSUP, nothing run) */
#define GEMM_FIXTURE_FAIL 2    /* run() fails (HQ_EDEVICE) */

typedef struct gemm_fixture_state {
  int accepts_calls; /* every accepts() */
  int runs;          /* products computed */
  int queries;       /* run() with HQ_GEMM_QUERY */
  int declines;      /* run() that declined or failed */
  int mode;          /* GEMM_FIXTURE_*, set by the test */
} gemm_fixture_state;

#endif
