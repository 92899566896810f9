/* row_isa_level_by_hand.c - the CPU's f32 row functions written out by hand (runtime/cpu/cpu_row_by_hand.c) compiled for one x86-64 level under names of their own (row_isa_level.h), for bench/row_isa. */
#include "row_isa_level.h"

#include "runtime/cpu/cpu_row_by_hand.c"
