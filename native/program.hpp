// A Program is a recorded graph kept for replay: a captured training step. Its inputs are
// placeholders that live in one block (filled by one upload per replay), its outputs live in
// another (read by one download), its intermediates in an arena planned once by liveness.
// Tensors it reads but does not make (parameters, optimizer moments, buffers) are read where
// they are at each replay, so in-place updates and buffer writes are seen.
#pragma once

#include <vector>

#include "ops.hpp"

namespace rk {

class Program {
  public:
    // nodes: a recording; inputs: pending tensors no node produces; outputs: node outputs.
    Program(std::vector<Node> nodes, Inputs inputs, Inputs outputs);

    // Runs the program: host_inputs[i] holds inputs[i]'s bytes, outputs are written to
    // host_outputs[i]. On the GPU: one upload, one submission, one download.
    void replay(const std::vector<const void*>& host_inputs, const std::vector<void*>& host_outputs);

    size_t n_nodes() const { return nodes_.size(); }
    size_t n_live() const;
    size_t arena_bytes() const { return arena_bytes_; }
    Device device() const { return device_; }

  private:
    std::vector<Node> nodes_;
    std::vector<bool> live_;
    Inputs inputs_, outputs_;
    Device device_ = Device::cpu;
    TensorPtr input_block_, output_block_;  // u8 tensors holding every input / output
    std::vector<size_t> input_offsets_, output_offsets_;
    std::shared_ptr<Storage> arena_;
    size_t arena_bytes_ = 0;
};

}  // namespace rk
