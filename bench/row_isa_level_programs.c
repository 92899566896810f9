/* row_isa_level_programs.c - the CPU row programs (runtime/cpu/cpu_row_programs.c) compiled for one x86-64 level under names of their own (row_isa_level.h), for bench/row_isa. */
#include "row_isa_level.h"

#include "runtime/cpu/cpu_row_programs.c"
