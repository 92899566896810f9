/* plan.c - stub until written */
typedef int al_stub_plan;
