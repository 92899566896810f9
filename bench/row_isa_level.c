/* row_isa_level.c - the CPU row driver (runtime/cpu/cpu_rows.c) compiled for one x86-64 level under names of its own (row_isa_level.h), for bench/row_isa. */
#include "row_isa_level.h"

#include "runtime/cpu/cpu_rows.c"
