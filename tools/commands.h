/*
** commands.h -- the entry points of the `hq` subcommands, which tools/hq.c dispatches to.
*/
#ifndef HQ_COMMANDS_H
#define HQ_COMMANDS_H

/* argc/argv start at the subcommand's own name. Return the process exit status: 0 success,
   1 failure (the error is printed), 2 usage error. */
int hq_cmd_info(int argc, char **argv);     /* tools/cmd_info.c */
int hq_cmd_recipe(int argc, char **argv);   /* tools/cmd_recipe.c */
int hq_cmd_quantize(int argc, char **argv); /* tools/cmd_quantize.c */
int hq_cmd_bench(int argc, char **argv);    /* tools/cmd_bench.c */
int hq_cmd_train(int argc, char **argv);    /* tools/cmd_train.c */
/* hq bench --gemm (tools/bench_gemm.c): argv as hq_cmd_bench's. */
int hq_bench_gemm(int argc, char **argv);
/* mpirun -np N hq bench --dist (tools/bench_dist.c): argv as hq_cmd_bench's. */
int hq_bench_dist(int argc, char **argv);

#endif
