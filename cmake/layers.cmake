# The C++ layers and which layers each may include (the list of layers is in CMakeLists.txt).
# Include paths are relative to the checkout ("ffi/comm/net.h"); "xla" is XLA's FFI headers.
set(JAX_RCCL_LAYER_DEPS_ffi/core "")
set(JAX_RCCL_LAYER_DEPS_ffi/planner ffi/core)
set(JAX_RCCL_LAYER_DEPS_ffi/compute ffi/core ffi/planner)
set(JAX_RCCL_LAYER_DEPS_ffi/host ffi/core ffi/planner ffi/compute)
set(JAX_RCCL_LAYER_DEPS_ffi/comm ffi/core ffi/planner)
set(JAX_RCCL_LAYER_DEPS_ffi/cpu ffi/core ffi/planner ffi/compute ffi/host ffi/comm)
set(JAX_RCCL_LAYER_DEPS_hip ffi/core ffi/planner ffi/compute)
set(JAX_RCCL_LAYER_DEPS_ffi/gpu ffi/core ffi/planner ffi/comm hip)
set(JAX_RCCL_LAYER_DEPS_ffi/handlers ffi/core ffi/planner ffi/host ffi/comm ffi/cpu ffi/gpu hip xla)
set(JAX_RCCL_LAYER_DEPS_ffi/bind ffi/core ffi/planner ffi/host ffi/comm ffi/cpu ffi/gpu hip ffi/handlers)
set(JAX_RCCL_LAYER_DEPS_ffi/testing ffi/core ffi/planner ffi/host ffi/comm ffi/cpu ffi/bind)

# Fails when a file of `layer` includes a project header outside the layers it may use.
function(jax_rccl_layer root layer)
  set(allowed ${layer} ${JAX_RCCL_LAYER_DEPS_${layer}})
  set(patterns "${root}/${layer}/*.h" "${root}/${layer}/*.cc" "${root}/${layer}/*.hip"
      "${root}/${layer}/*/*.hip")
  if(CMAKE_PROJECT_NAME)  # configuring (not `cmake -P`): a new file or an edit re-runs the check
    file(GLOB files CONFIGURE_DEPENDS ${patterns})
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${files})
  else()
    file(GLOB files ${patterns})
  endif()
  foreach(f IN LISTS files)
    file(STRINGS "${f}" includes REGEX "^#include \"")
    foreach(line IN LISTS includes)
      string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" inc "${line}")
      set(ok FALSE)
      foreach(a IN LISTS allowed)
        string(LENGTH "${a}/" n)
        string(SUBSTRING "${inc}" 0 ${n} head)
        if(head STREQUAL "${a}/")
          set(ok TRUE)
        endif()
      endforeach()
      if(NOT ok)
        file(RELATIVE_PATH rel "${root}" "${f}")
        string(REPLACE ";" ", " shown "${allowed}")
        message(FATAL_ERROR "${rel} includes \"${inc}\": the layer ${layer} may include only "
                            "${shown} (the layers in cmake/layers.cmake)")
      endif()
    endforeach()
  endforeach()
endfunction()
function(jax_rccl_check_layers root)
  foreach(layer ffi/core ffi/planner ffi/compute ffi/host ffi/comm ffi/cpu hip ffi/gpu ffi/handlers
          ffi/bind ffi/testing)
    jax_rccl_layer("${root}" ${layer})
  endforeach()
endfunction()

# Script mode: cmake -DROOT=<checkout> -P cmake/layers.cmake (tests/test_layers.py).
if(NOT CMAKE_PROJECT_NAME AND DEFINED ROOT)
  jax_rccl_check_layers("${ROOT}")
endif()

