/* row_isa_level_layer_norm.c - the CPU's f32 layer_norm functions written out by hand (runtime/cpu/cpu_row_layer_norm.c) compiled for one x86-64 level under names of their own (row_isa_level.h), for bench/row_isa. */
#include "row_isa_level.h"

#include "runtime/cpu/cpu_row_layer_norm.c"
