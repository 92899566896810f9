/* safetensors_memory.h - a safetensors file read from bytes in memory (a bundle's initial state), with the checks alloy_safetensors_load makes on a file. */
#ifndef ALLOY_SAFETENSORS_MEMORY_H
#define ALLOY_SAFETENSORS_MEMORY_H

#include "alloy/safetensors.h"

/* As alloy_safetensors_load, from bytes[0..len); where names them in every
 * message ("step.alloy: section initial state"). */
AL_HIDDEN alloy_status io_safetensors_load_memory(const void *bytes, size_t len, const char *where,
                                                  alloy_safetensors **out, char *err, size_t errlen);

#endif
