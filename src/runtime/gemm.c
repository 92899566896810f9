/* stub: being written */
typedef int al_stub_gemm;
